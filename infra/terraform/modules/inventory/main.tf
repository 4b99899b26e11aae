# The cluster file `sluice deploy` reads, rendered from a cluster's addresses. No
# provider and no resource: it renders the same offline, which is how it is tested.

terraform {
  required_version = ">= 1.5"
}

variable "name" {
  description = "The cluster's name: names services and the operator token file."
  type        = string
  validation {
    condition     = can(regex("^[a-z0-9-]+$", var.name))
    error_message = "name may hold only a-z, 0-9 and -."
  }
}

variable "object_store" {
  description = "Where state and checkpoints live: s3://bucket/prefix."
  type        = string
  validation {
    condition     = startswith(var.object_store, "s3://") || startswith(var.object_store, "file:///")
    error_message = "object_store must be s3://bucket/prefix or file:///dir."
  }
}

variable "sluice_version" {
  description = "The Sluice release every host runs, fetched from sluice_releases; null: the binary of whoever runs `sluice deploy`."
  type        = string
  default     = null
  validation {
    condition     = var.sluice_version == null || can(regex("^[A-Za-z0-9_+-][A-Za-z0-9._+-]{0,63}$", var.sluice_version))
    error_message = "sluice_version may hold only letters, digits, ., -, _ and + (at most 64)."
  }
}

variable "sluice_releases" {
  description = "Where release {version} is fetched from: an https://, http:// or file:/// URL or a path with {version} in it."
  type        = string
  default     = null
  validation {
    condition     = var.sluice_releases == null || strcontains(coalesce(var.sluice_releases, "x"), "{version}")
    error_message = "sluice_releases must contain {version}."
  }
}

variable "ssh_user" {
  description = "The SSH user on every host."
  type        = string
  default     = "admin"
}

variable "jump_host" {
  description = "user@host to reach private addresses through (ssh -J); null when they are reachable."
  type        = string
  default     = null
}

variable "env" {
  description = "Environment of every role (no secrets needed on AWS: instance roles carry the credentials)."
  type        = map(string)
  default     = {}
}

variable "coordinators" {
  description = "The coordinator hosts (1, or 3 or 5 electing a leader through etcd members deploy runs on them): the address SSH reaches and the one roles bind."
  type = list(object({
    address = string
    bind    = string
  }))
  validation {
    condition     = contains([1, 3, 5], length(var.coordinators))
    error_message = "coordinators must list 1, 3 or 5 hosts (etcd needs a majority of its members)."
  }
}

variable "state_nodes" {
  description = "State-service hosts, with the memory budget, disk cache and data directory of each."
  type = list(object({
    address    = string
    memory     = string
    disk_cache = string
    data_dir   = string
  }))
  validation {
    condition     = length(var.state_nodes) >= 1
    error_message = "a cluster with remote state needs at least one state node."
  }
}

variable "workers" {
  description = "Worker hosts deploy starts (auto-scaled workers register themselves and are not listed)."
  type = list(object({
    address = string
    slots   = number
  }))
  default = []
}

variable "worker_join" {
  description = "Whether workers not listed (an auto-scaling group) join with the cluster's join token."
  type        = bool
  default     = false
}

variable "service" {
  description = "How hosts keep roles running: systemd or process."
  type        = string
  default     = "systemd"
  validation {
    condition     = contains(["systemd", "process"], var.service)
    error_message = "service must be systemd or process."
  }
}

locals {
  jump = var.jump_host == null ? {} : { jump = var.jump_host }
  # The first coordinator's host keeps the name `coordinator`; standbys are numbered.
  coordinator_hosts = [for i, c in var.coordinators : i == 0 ? "coordinator" : "coordinator-${i}"]
  # One coordinator, or a leader and standbys with an etcd member deploy runs on each.
  ha = length(var.coordinators) > 1
  coordinator_roles = {
    coordinator  = local.ha ? null : { host = "coordinator", http = 8081, grpc = 6123 }
    coordinators = local.ha ? [for h in local.coordinator_hosts : { host = h, http = 8081, grpc = 6123 }] : null
    etcd         = local.ha ? { hosts = local.coordinator_hosts, client_port = 2379, peer_port = 2380 } : null
  }
  hosts = merge(
    { for i, c in var.coordinators : local.coordinator_hosts[i] => { address = c.address, bind = c.bind, user = var.ssh_user } },
    { for i, s in var.state_nodes : "state-${i}" => merge({ address = s.address, user = var.ssh_user }, local.jump) },
    { for i, w in var.workers : "worker-${i}" => merge({ address = w.address, user = var.ssh_user }, local.jump) },
  )
  cluster = merge(
    {
      name         = var.name
      object_store = var.object_store
      service      = var.service
      hosts        = local.hosts
      state_nodes = [for i, s in var.state_nodes : {
        host = "state-${i}", port = 7071, memory = s.memory, disk_cache = s.disk_cache, data_dir = s.data_dir
      }]
      # Auto-scaled workers register themselves; deploy needs one it starts itself only
      # when none are listed, so the coordinator's host runs one then.
      workers = length(var.workers) > 0 ? [for i, w in var.workers : { host = "worker-${i}", slots = w.slots }] : [{ host = "coordinator", slots = 1 }]
    },
    length(var.env) > 0 ? { env = var.env } : {},
    var.worker_join ? { worker_join = true } : {},
    var.sluice_releases != null ? { releases = var.sluice_releases } : {},
    var.sluice_version != null ? { version = var.sluice_version } : {},
    { for k, v in local.coordinator_roles : k => v if v != null },
  )
}

output "cluster_file" {
  description = "The cluster file for `sluice deploy` (YAML)."
  value       = yamlencode(local.cluster)
}
