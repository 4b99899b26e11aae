# A Sluice cluster on AWS: terraform apply, then
#   terraform output -raw cluster_file > cluster.yaml
#   sluice deploy cluster.yaml
# (auto-scaled workers start themselves and register with the coordinator.)

terraform {
  required_version = ">= 1.5"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.40"
    }
  }
}

provider "aws" {
  region = var.region
}

variable "region" {
  description = "The AWS region."
  type        = string
  default     = "eu-west-1"
}

variable "admin_cidrs" {
  description = "Who may reach the coordinator (SSH, REST)."
  type        = list(string)
}

variable "ssh_key_name" {
  description = "An EC2 key pair of yours."
  type        = string
}

variable "sluice_url" {
  description = "An HTTPS URL of the sluice binary (cargo build --profile dist)."
  type        = string
}

variable "sluice_sha256" {
  description = "Its SHA-256."
  type        = string
}

module "sluice" {
  source             = "../../modules/aws-cluster"
  name               = "demo"
  availability_zones = ["${var.region}a", "${var.region}b"]
  admin_cidrs        = var.admin_cidrs
  ssh_key_name       = var.ssh_key_name
  sluice_url         = var.sluice_url
  sluice_sha256      = var.sluice_sha256
  state_node_count   = 2
  workers            = { min = 2, desired = 2, max = 6 }
  tags               = { project = "sluice-demo" }
}

output "cluster_file" {
  description = "The cluster file for sluice deploy."
  value       = module.sluice.cluster_file
}

output "rest_url" {
  description = "The REST API."
  value       = module.sluice.rest_url
}
