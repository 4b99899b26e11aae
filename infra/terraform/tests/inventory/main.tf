# A fixture: the inventory module rendered from made-up addresses, offline. The
# infrastructure test writes `cluster_file` out and checks it with `sluice deploy check`.

module "inventory" {
  source       = "../../modules/inventory"
  name         = "fixture"
  object_store = "s3://sluice-fixture/cluster"
  jump_host    = "admin@203.0.113.10"
  env          = { AWS_REGION = "eu-west-1" }
  coordinators = [{ address = "203.0.113.10", bind = "10.0.0.10" }]
  state_nodes = [
    { address = "10.0.1.10", memory = "8GiB", disk_cache = "100GiB", data_dir = "/mnt/nvme/sluice" },
    { address = "10.0.1.11", memory = "8GiB", disk_cache = "100GiB", data_dir = "/mnt/nvme/sluice" },
  ]
  workers = [
    { address = "10.0.2.10", slots = 2 },
  ]
}

output "cluster_file" {
  value = module.inventory.cluster_file
}

# Three coordinators: a leader and standbys electing through etcd members deploy runs.
module "inventory_ha" {
  source          = "../../modules/inventory"
  name            = "fixture-ha"
  worker_join     = true
  sluice_version  = "0.4.0"
  sluice_releases = "https://downloads.example.com/sluice/{version}/sluice-linux-x86_64"
  object_store    = "s3://sluice-fixture/cluster"
  jump_host       = "admin@203.0.113.10"
  coordinators = [
    { address = "203.0.113.10", bind = "10.0.0.10" },
    { address = "203.0.113.11", bind = "10.0.0.11" },
    { address = "203.0.113.12", bind = "10.0.0.12" },
  ]
  state_nodes = [
    { address = "10.0.1.10", memory = "8GiB", disk_cache = "100GiB", data_dir = "/mnt/nvme/sluice" },
  ]
}

output "cluster_file_ha" {
  value = module.inventory_ha.cluster_file
}
