# A Sluice cluster on AWS: terraform apply, then
#   terraform output -raw cluster_file > cluster.yaml
#   sluice deploy cluster.yaml
#   terraform apply -var join_token=$(cat demo.join-token) -var cluster_ca="$(cat demo.tls/ca.pem)"
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

variable "join_token" {
  description = "After the first sluice deploy: the contents of demo.join-token (auto-scaled workers join with it)."
  type        = string
  default     = ""
  sensitive   = true
}

variable "cluster_ca" {
  description = "After the first sluice deploy: the contents of demo.tls/ca.pem."
  type        = string
  default     = ""
}

module "sluice" {
  source             = "../../modules/aws-cluster"
  name               = "demo"
  availability_zones = ["${var.region}a", "${var.region}b"]
  admin_cidrs        = var.admin_cidrs
  ssh_key_name       = var.ssh_key_name
  sluice_url         = var.sluice_url
  sluice_sha256      = var.sluice_sha256
  join_token         = var.join_token
  cluster_ca         = var.cluster_ca
  coordinator_count  = 1 # 3: a leader and standbys, with etcd members deploy runs on them
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
