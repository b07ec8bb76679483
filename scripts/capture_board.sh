#!/usr/bin/env bash
# Copy the files `agent.hardware.probe` reads from this device into DEST, laid out like the root
# filesystem, so the board can be added as a fake tree under tests/fakes/.
# Usage: scripts/capture_board.sh DEST
set -euo pipefail
dest=${1:?usage: $0 DEST}
files=(
  /proc/device-tree/model
  /sys/firmware/devicetree/base/model
  /etc/nv_tegra_release
  /sys/devices/system/cpu/online
)
shopt -s nullglob
files+=(/proc/driver/nvidia/gpus/*/information)
for f in "${files[@]}"; do
  if [ -r "$f" ]; then
    mkdir -p "$dest$(dirname "$f")"
    cat "$f" > "$dest$f"   # cat, not cp: procfs files report size 0
    echo "captured $f"
  fi
done
