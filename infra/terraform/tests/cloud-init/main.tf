# A fixture: the aws-cluster module's cloud-init templates rendered with sample values,
# offline. The infrastructure test checks each with `cloud-init schema`.

locals {
  templates = "../../modules/aws-cluster/templates"
}

output "coordinator" {
  value = templatefile("${local.templates}/host.yaml.tftpl", { name = "fixture", role = "coordinator", data_dir = "" })
}

output "state" {
  value = templatefile("${local.templates}/host.yaml.tftpl", { name = "fixture", role = "state", data_dir = "/mnt/nvme/sluice" })
}

output "worker" {
  value = templatefile("${local.templates}/worker.yaml.tftpl", {
    name             = "fixture"
    coordinator_grpc = "http://10.0.0.10:6123"
    slots            = 2
    sluice_url       = "https://downloads.example.com/sluice"
    sluice_sha256    = "0000000000000000000000000000000000000000000000000000000000000000"
  })
}
