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

variable "coordinator" {
  description = "The coordinator host: the address SSH reaches and the one roles bind."
  type = object({
    address = string
    bind    = string
  })
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
  hosts = merge(
    { coordinator = { address = var.coordinator.address, bind = var.coordinator.bind, user = var.ssh_user } },
    { for i, s in var.state_nodes : "state-${i}" => merge({ address = s.address, user = var.ssh_user }, local.jump) },
    { for i, w in var.workers : "worker-${i}" => merge({ address = w.address, user = var.ssh_user }, local.jump) },
  )
  cluster = merge(
    {
      name         = var.name
      object_store = var.object_store
      service      = var.service
      hosts        = local.hosts
      coordinator  = { host = "coordinator", http = 8081, grpc = 6123 }
      state_nodes = [for i, s in var.state_nodes : {
        host = "state-${i}", port = 7071, memory = s.memory, disk_cache = s.disk_cache, data_dir = s.data_dir
      }]
      # Auto-scaled workers register themselves; deploy needs one it starts itself only
      # when none are listed, so the coordinator's host runs one then.
      workers = length(var.workers) > 0 ? [for i, w in var.workers : { host = "worker-${i}", slots = w.slots }] : [{ host = "coordinator", slots = 1 }]
    },
    length(var.env) > 0 ? { env = var.env } : {},
  )
}

output "cluster_file" {
  description = "The cluster file for `sluice deploy` (YAML)."
  value       = yamlencode(local.cluster)
}
