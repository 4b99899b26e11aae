# A fixture: the aws-cluster module's cloud-init templates rendered with sample values,
# offline. The infrastructure test checks each with `cloud-init schema`.

locals {
  templates = "../../modules/aws-cluster/templates"
}

output "coordinator" {
  value = templatefile("${local.templates}/host.yaml.tftpl", { name = "fixture", role = "coordinator", data_dir = "", etcd = true })
}

output "state" {
  value = templatefile("${local.templates}/host.yaml.tftpl", { name = "fixture", role = "state", data_dir = "/mnt/nvme/sluice", etcd = false })
}

output "worker" {
  value = templatefile("${local.templates}/worker.yaml.tftpl", {
    name             = "fixture"
    coordinator_grpc = "https://10.0.0.10:6123"
    coordinator_rest = "https://10.0.0.10:8081"
    join_token       = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    cluster_ca       = "-----BEGIN CERTIFICATE-----\nMIIBfixture\n-----END CERTIFICATE-----\n"
    slots            = 2
    sluice_url       = "https://downloads.example.com/sluice"
    sluice_sha256    = "0000000000000000000000000000000000000000000000000000000000000000"
  })
}
