module "inventory" {
  source       = "../inventory"
  name         = var.name
  object_store = "s3://${aws_s3_bucket.state.bucket}/cluster"
  ssh_user     = var.ssh_user
  jump_host    = "${var.ssh_user}@${aws_instance.coordinator[0].public_ip}"
  env          = { AWS_REGION = data.aws_region.current.name }
  coordinators = [for c in aws_instance.coordinator : { address = c.public_ip, bind = c.private_ip }]
  worker_join  = true
  # deploy installs this release on the hosts it starts roles on (null: its own binary)
  sluice_version  = var.sluice_version
  sluice_releases = var.sluice_releases
  state_nodes = [for s in aws_instance.state : {
    address    = s.private_ip
    memory     = var.state_memory
    disk_cache = var.state_disk_cache
    data_dir   = local.data_dir
  }]
}

output "cluster_file" {
  description = "The cluster file for `sluice deploy` (terraform output -raw cluster_file > cluster.yaml)."
  value       = module.inventory.cluster_file
}

output "rest_url" {
  description = "The coordinators' REST API, reachable from admin_cidrs (https once sluice deploy has made the cluster's CA)."
  value       = join(",", [for c in aws_instance.coordinator : "https://${c.public_ip}:8081"])
}

output "bucket" {
  description = "The bucket holding state and checkpoints."
  value       = aws_s3_bucket.state.bucket
}
