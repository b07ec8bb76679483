#!/usr/bin/env bash
# The aarch64 smoke run (docs/arm64.md): edge-agent under qemu-aarch64-static on a Debian arm64
# root, `probe` and `detect` (LiteRT INT8, and ONNX Runtime when it imports there) compared with
# this machine's detections. Installs Debian's qemu-user-static and debootstrap when missing;
# the root and the aarch64 wheels are cached in ~/.cache/edge-agent/arm64 (EDGE_AGENT_ARM64_CACHE).
#   scripts/arm64_smoke.sh [--json] [--cache DIR]
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
need=()
command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
command -v dpkg-deb >/dev/null || need+=(dpkg)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]} (Debian)" >&2
  as_root apt-get update -qq >&2
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >&2
fi
scripts/setup.sh >&2  # .venv with edge-agent's current requirements (the aarch64 wheels follow them)
exec .venv/bin/python scripts/arm64_smoke.py "$@"
