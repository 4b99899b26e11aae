variable "name" {
  description = "The cluster's name: prefixes every resource and names the services."
  type        = string
  validation {
    condition     = can(regex("^[a-z0-9-]{1,24}$", var.name))
    error_message = "name: 1-24 characters of a-z, 0-9 and -."
  }
}

variable "vpc_cidr" {
  description = "The cluster's network."
  type        = string
  default     = "10.42.0.0/16"
  validation {
    condition     = can(cidrnetmask(var.vpc_cidr))
    error_message = "vpc_cidr must be an IPv4 CIDR block such as 10.42.0.0/16."
  }
}

variable "availability_zones" {
  description = "Two or more zones of the provider's region; private subnets spread over them."
  type        = list(string)
  validation {
    condition     = length(var.availability_zones) >= 2
    error_message = "give at least two availability zones."
  }
}

variable "admin_cidrs" {
  description = "Who may reach the coordinator's SSH and REST API (your office or VPN); never 0.0.0.0/0."
  type        = list(string)
  validation {
    condition     = length(var.admin_cidrs) > 0 && alltrue([for c in var.admin_cidrs : can(cidrnetmask(c)) && c != "0.0.0.0/0"])
    error_message = "admin_cidrs: one or more IPv4 CIDR blocks, and not 0.0.0.0/0."
  }
}

variable "ssh_key_name" {
  description = "The EC2 key pair `sluice deploy` logs in with."
  type        = string
}

variable "ssh_user" {
  description = "The login user of the image (admin on Debian)."
  type        = string
  default     = "admin"
}

variable "ami_id" {
  description = "The image of every instance; null: the newest official Debian 12 for x86_64."
  type        = string
  default     = null
}

variable "coordinator_count" {
  description = "Coordinators: 1, or 3 or 5 (a leader and standbys; deploy runs an etcd member on each for their election)."
  type        = number
  default     = 1
  validation {
    condition     = contains([1, 3, 5], var.coordinator_count)
    error_message = "coordinator_count must be 1, 3 or 5 (etcd needs a majority of its members)."
  }
}

variable "coordinator_instance_type" {
  description = "The coordinator's instance type."
  type        = string
  default     = "t3.medium"
}

variable "state_instance_type" {
  description = "State nodes' instance type: one with local NVMe for the disk cache (i4i, im4gn, is4gen families)."
  type        = string
  default     = "i4i.large"
}

variable "state_node_count" {
  description = "How many state nodes."
  type        = number
  default     = 1
  validation {
    condition     = var.state_node_count >= 1 && var.state_node_count <= 50
    error_message = "state_node_count: 1 to 50."
  }
}

variable "state_memory" {
  description = "Each state node's memory budget (block cache, write buffers, memory cache)."
  type        = string
  default     = "8GiB"
}

variable "state_disk_cache" {
  description = "Each state node's disk cache on its NVMe."
  type        = string
  default     = "300GiB"
}

variable "worker_instance_type" {
  description = "Workers' instance type."
  type        = string
  default     = "c7i.xlarge"
}

variable "worker_slots" {
  description = "Jobs each worker runs at once."
  type        = number
  default     = 2
}

variable "workers" {
  description = "The workers' auto-scaling group: min, desired and max instances."
  type = object({
    min     = number
    desired = number
    max     = number
  })
  default = { min = 2, desired = 2, max = 10 }
  validation {
    condition     = var.workers.min >= 0 && var.workers.min <= var.workers.desired && var.workers.desired <= var.workers.max
    error_message = "workers: 0 <= min <= desired <= max."
  }
}

variable "sluice_url" {
  description = "Where auto-scaled workers download the sluice binary from (HTTPS)."
  type        = string
  validation {
    condition     = startswith(var.sluice_url, "https://")
    error_message = "sluice_url must be an https:// URL."
  }
}

variable "sluice_version" {
  description = "The release `sluice deploy` installs on the hosts it starts roles on, fetched from sluice_releases (null: the deploying binary). Keep it the release sluice_url points at."
  type        = string
  default     = null
}

variable "sluice_releases" {
  description = "Where `sluice deploy` fetches release {version} from: a URL with {version} in it (null: no named releases)."
  type        = string
  default     = null
  validation {
    condition     = var.sluice_releases == null || strcontains(coalesce(var.sluice_releases, "x"), "{version}")
    error_message = "sluice_releases must contain {version}."
  }
}

variable "sluice_sha256" {
  description = "The binary's SHA-256; a worker refuses a download that does not match."
  type        = string
  validation {
    condition     = can(regex("^[0-9a-f]{64}$", var.sluice_sha256))
    error_message = "sluice_sha256: 64 lowercase hex digits."
  }
}

variable "join_token" {
  description = "The token auto-scaled workers join with: the <name>.join-token file the first `sluice deploy` makes beside the cluster file. Empty until then; workers keep retrying to join."
  type        = string
  default     = ""
  sensitive   = true
  validation {
    condition     = var.join_token == "" || can(regex("^[0-9a-f]{64}$", var.join_token))
    error_message = "join_token: the 64 hex digits of <name>.join-token."
  }
}

variable "cluster_ca" {
  description = "The cluster's CA certificate (PEM): <name>.tls/ca.pem, made by the first `sluice deploy`. Workers check the coordinators against it when they join."
  type        = string
  default     = ""
  validation {
    condition     = var.cluster_ca == "" || startswith(trimspace(var.cluster_ca), "-----BEGIN CERTIFICATE-----")
    error_message = "cluster_ca: a PEM certificate (the contents of <name>.tls/ca.pem)."
  }
}

variable "checkpoint_retention_days" {
  description = "Noncurrent object versions (superseded checkpoints and state files) are deleted after this many days."
  type        = number
  default     = 7
  validation {
    condition     = var.checkpoint_retention_days >= 1
    error_message = "checkpoint_retention_days: at least 1."
  }
}

variable "force_destroy_bucket" {
  description = "Let `terraform destroy` delete the bucket with its state and checkpoints (for test clusters only)."
  type        = bool
  default     = false
}

variable "tags" {
  description = "Tags on every resource."
  type        = map(string)
  default     = {}
}
