#!/usr/bin/env bash
# Installs what building and testing Sluice needs on a fresh Debian machine, when missing.
# Idempotent and quiet when everything is there. protoc is vendored by a crate.
set -euo pipefail

need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3 python3-pip)
python3 -m pip --version >/dev/null 2>&1 || need_apt+=(python3-pip)
# Azurite, the Azure Blob emulator of the tests, comes from npm.
command -v npm >/dev/null 2>&1 || need_apt+=(nodejs npm)
# RocksDB's bindings (librocksdb-sys) run bindgen, which needs libclang.
compgen -G '/usr/lib/llvm-*/lib/libclang.so*' >/dev/null || need_apt+=(libclang-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing system packages: ${need_apt[*]}" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >&2
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo is missing: install Rust (stable) with rustup first" >&2
  exit 1
fi
