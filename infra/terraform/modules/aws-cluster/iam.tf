# One instance role per Sluice role, each allowed only its own prefix of the bucket:
# the coordinator its job records and checkpoint metadata, state nodes the state
# files, workers nothing but reading the cluster's key (auto-scaled workers fetch
# nothing from the bucket).

locals {
  role_prefixes = {
    coordinator = "coordinator"
    state       = "state"
  }
}

resource "aws_iam_role" "role" {
  for_each = toset(["coordinator", "state", "worker"])
  name     = "${var.name}-sluice-${each.key}"
  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Principal = { Service = "ec2.amazonaws.com" }
      Action    = "sts:AssumeRole"
    }]
  })
  tags = var.tags
}

resource "aws_iam_role_policy" "bucket" {
  for_each = local.role_prefixes
  name     = "bucket-${each.value}"
  role     = aws_iam_role.role[each.key].id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Effect    = "Allow"
        Action    = ["s3:ListBucket"]
        Resource  = aws_s3_bucket.state.arn
        Condition = { StringLike = { "s3:prefix" = ["cluster/${each.value}/*", "cluster/${each.value}"] } }
      },
      {
        Effect   = "Allow"
        Action   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]
        Resource = "${aws_s3_bucket.state.arn}/cluster/${each.value}/*"
      },
      {
        Effect   = "Allow"
        Action   = ["kms:Decrypt", "kms:GenerateDataKey"]
        Resource = aws_kms_key.this.arn
      },
    ]
  })
}

resource "aws_iam_instance_profile" "role" {
  for_each = aws_iam_role.role
  name     = each.value.name
  role     = each.value.name
  tags     = var.tags
}
