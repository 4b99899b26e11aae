data "aws_ami" "debian" {
  count       = var.ami_id == null ? 1 : 0
  most_recent = true
  owners      = ["136693071363"] # Debian's official images
  filter {
    name   = "name"
    values = ["debian-12-amd64-*"]
  }
  filter {
    name   = "architecture"
    values = ["x86_64"]
  }
}

locals {
  ami      = var.ami_id != null ? var.ami_id : data.aws_ami.debian[0].id
  data_dir = "/mnt/nvme/sluice"
  # Workers are given every coordinator and follow the leader.
  coordinator_grpc = join(",", [for c in aws_instance.coordinator : "https://${c.private_ip}:6123"])
  coordinator_rest = join(",", [for c in aws_instance.coordinator : "https://${c.private_ip}:8081"])
}

# The coordinators: one, or a leader and standbys that elect through the etcd members
# deploy runs on these same hosts (Debian's etcd-server, installed by cloud-init).
resource "aws_instance" "coordinator" {
  #checkov:skip=CKV_AWS_88:the coordinators are the hosts operators reach (SSH jump, REST), and only from admin_cidrs
  count                       = var.coordinator_count
  ami                         = local.ami
  instance_type               = var.coordinator_instance_type
  subnet_id                   = aws_subnet.public.id
  associate_public_ip_address = true
  key_name                    = var.ssh_key_name
  iam_instance_profile        = aws_iam_instance_profile.role["coordinator"].name
  vpc_security_group_ids      = [aws_security_group.cluster.id, aws_security_group.admin.id]
  monitoring                  = true
  ebs_optimized               = true
  user_data                   = templatefile("${path.module}/templates/host.yaml.tftpl", { name = var.name, role = "coordinator", data_dir = "", etcd = var.coordinator_count > 1 })
  metadata_options {
    http_tokens   = "required"
    http_endpoint = "enabled"
  }
  root_block_device {
    encrypted  = true
    kms_key_id = aws_kms_key.this.arn
  }
  tags = merge(var.tags, { Name = "${var.name}-coordinator-${count.index}", "sluice:role" = "coordinator" })
}

resource "aws_instance" "state" {
  count                  = var.state_node_count
  ami                    = local.ami
  instance_type          = var.state_instance_type
  subnet_id              = aws_subnet.private[count.index % length(aws_subnet.private)].id
  key_name               = var.ssh_key_name
  iam_instance_profile   = aws_iam_instance_profile.role["state"].name
  vpc_security_group_ids = [aws_security_group.cluster.id]
  monitoring             = true
  ebs_optimized          = true
  user_data              = templatefile("${path.module}/templates/host.yaml.tftpl", { name = var.name, role = "state", data_dir = local.data_dir, etcd = false })
  metadata_options {
    http_tokens   = "required"
    http_endpoint = "enabled"
  }
  root_block_device {
    encrypted  = true
    kms_key_id = aws_kms_key.this.arn
  }
  tags = merge(var.tags, { Name = "${var.name}-state-${count.index}", "sluice:role" = "state" })
}

resource "aws_launch_template" "worker" {
  name_prefix            = "${var.name}-worker-"
  image_id               = local.ami
  instance_type          = var.worker_instance_type
  key_name               = var.ssh_key_name
  vpc_security_group_ids = [aws_security_group.cluster.id]
  ebs_optimized          = true
  user_data = base64encode(templatefile("${path.module}/templates/worker.yaml.tftpl", {
    name             = var.name
    coordinator_grpc = local.coordinator_grpc
    coordinator_rest = local.coordinator_rest
    join_token       = var.join_token
    cluster_ca       = var.cluster_ca
    slots            = var.worker_slots
    sluice_url       = var.sluice_url
    sluice_sha256    = var.sluice_sha256
  }))
  iam_instance_profile {
    name = aws_iam_instance_profile.role["worker"].name
  }
  metadata_options {
    http_tokens   = "required"
    http_endpoint = "enabled"
  }
  monitoring {
    enabled = true
  }
  block_device_mappings {
    device_name = "/dev/xvda"
    ebs {
      encrypted   = true
      kms_key_id  = aws_kms_key.this.arn
      volume_size = 20
    }
  }
  tag_specifications {
    resource_type = "instance"
    tags          = merge(var.tags, { Name = "${var.name}-worker", "sluice:role" = "worker" })
  }
  tags = var.tags
}

resource "aws_autoscaling_group" "worker" {
  name_prefix         = "${var.name}-worker-"
  min_size            = var.workers.min
  desired_capacity    = var.workers.desired
  max_size            = var.workers.max
  vpc_zone_identifier = aws_subnet.private[*].id
  health_check_type   = "EC2"
  launch_template {
    id      = aws_launch_template.worker.id
    version = "$Latest"
  }
  # Setting the join token after the first deploy changes the launch template: the
  # workers are replaced, a few at a time, by ones that join.
  instance_refresh {
    strategy = "Rolling"
    preferences {
      min_healthy_percentage = 50
    }
  }
  tag {
    key                 = "sluice:cluster"
    value               = var.name
    propagate_at_launch = true
  }
}
