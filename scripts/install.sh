#!/usr/bin/env bash
# Install edge-agent as a systemd service on a Jetson, a Raspberry Pi or any Debian/Ubuntu box
# (README.md: "Installing on a device"). Run it as root from a checkout; running it again is
# safe (it upgrades the package and keeps the configuration).
#
#   sudo scripts/install.sh [--broker mqtt://HOST:PORT] [--device-id ID] [--status-listen HOST:PORT]
#   sudo scripts/install.sh --claim claim.json  # the device enrols itself on its first start
#   sudo scripts/install.sh --uninstall        # everything but the state directory
#
# What it does, each step skipped when already done:
#   0. python3 and python3-venv from apt-get where the system lacks them (a minimal Debian), then
#      Python 3.10 or newer (Ubuntu 22.04's is 3.10, Debian 12's and Raspberry Pi OS's 3.11) on a
#      64-bit system (aarch64 or x86_64), checked before anything is written; /etc/os-release
#      only names the system in the output;
#   1. the board: Jetson (/etc/nv_tegra_release), Raspberry Pi (device-tree model) or generic;
#   2. the user and group edge-agent (system, no login), and the groups the unit asks for
#      (video, gpio, i2c, render) where the board lacks them;
#   3. a venv in /opt/edge-agent/venv (with --system-site-packages on a Jetson, so JetPack's
#      TensorRT and OpenCV are visible), and the package with the board's extras in it;
#   4. /etc/edge-agent/agent.yaml from `edge-agent config example` when there is none (an
#      existing one is never touched); with --claim, the claim in /etc/edge-agent/claim.json
#      (0600, the user edge-agent's) and, when there is no agent.yaml, a minimal one naming it,
#      in /var/lib/edge-agent/agent.yaml with /etc/edge-agent/agent.yaml a link to it (the
#      service may write only its state directory, and enrolment writes the credentials there);
#   5. /etc/systemd/system/edge-agent.service, enabled and (re)started.
#
# Options:
#   --prefix DIR       install into DIR as if it were / (a throwaway root for testing): users and
#                      groups go to DIR/etc/passwd and DIR/etc/group, the unit is enabled with
#                      `systemctl --root`, nothing is started, the board is read under DIR
#   --board B          jetson, rpi or generic instead of detecting it
#   --from SPEC        what to pip install (default: this checkout); a wheel or a directory
#   --python PY        the Python that makes the venv (default: python3; 3.10 or newer)
#   --broker URL, --device-id ID, --status-listen HOST:PORT, --source SRC
#                      passed to `edge-agent config example` for a new agent.yaml
#   --claim FILE       a claim from `edge-agent fleet enrol claim`: the device asks to join on
#                      its first start and serves once the operator approves (docs/fleet.md)
#   --no-start         enable the service but do not (re)start it
#   --uninstall        stop, disable and remove the unit, the venv, /etc/edge-agent and the user;
#                      the state directory (/var/lib/edge-agent: installed versions) stays
# Environment: EDGE_AGENT_PIP_ARGS adds pip options (e.g. --index-url, or --no-deps in tests);
# EDGE_AGENT_APT_GET names the apt-get to run (default apt-get).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
prefix="" board="" spec="" python=python3 uninstall=no start=yes
apt_get=${EDGE_AGENT_APT_GET:-apt-get}
broker="mqtt://localhost:1883" device_id="" status_listen="127.0.0.1:8080" source="" claim=""

die() { echo "install.sh: $*" >&2; exit 1; }
say() { echo "edge-agent install: $*"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=$(realpath -m "${2:?--prefix DIR}"); shift 2 ;;
    --board) board=${2:?--board jetson|rpi|generic}; shift 2 ;;
    --from) spec=${2:?--from SPEC}; shift 2 ;;
    --python) python=${2:?--python PY}; shift 2 ;;
    --broker) broker=${2:?--broker URL}; shift 2 ;;
    --device-id) device_id=${2:?--device-id ID}; shift 2 ;;
    --status-listen) status_listen=${2:?--status-listen HOST:PORT}; shift 2 ;;
    --source) source=${2:?--source SRC}; shift 2 ;;
    --claim) claim=$(realpath -m "${2:?--claim FILE}"); shift 2 ;;
    --no-start) start=no; shift ;;
    --uninstall) uninstall=yes; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
[ -z "$claim" ] || [ -f "$claim" ] || die "--claim $claim: no such file"
[ -n "$prefix" ] || [ "$(id -u)" = 0 ] || die "run it as root (sudo), or with --prefix DIR to try it"

venv=$prefix/opt/edge-agent/venv
etc=$prefix/etc/edge-agent
unit=$prefix/etc/systemd/system/edge-agent.service
state=$prefix/var/lib/edge-agent
systemctl_root=(systemctl); [ -z "$prefix" ] || systemctl_root=(systemctl "--root=$prefix")
shadow_root=(); [ -z "$prefix" ] || { shadow_root=(--prefix "$prefix"); mkdir -p "$prefix/etc"; }

has_user() { if [ -n "$prefix" ]; then grep -qs "^$1:" "$prefix/etc/passwd"; else getent passwd "$1" >/dev/null; fi; }
has_group() { if [ -n "$prefix" ]; then grep -qs "^$1:" "$prefix/etc/group"; else getent group "$1" >/dev/null; fi; }
uid_of() { if [ -n "$prefix" ]; then awk -F: -v u="$1" '$1 == u {print $3}' "$prefix/etc/passwd"; else id -u "$1"; fi; }
gid_of() { if [ -n "$prefix" ]; then awk -F: -v g="$1" '$1 == g {print $3}' "$prefix/etc/group"; else getent group "$1" | cut -d: -f3; fi; }

if [ "$uninstall" = yes ]; then
  if [ -e "$unit" ]; then
    if [ -z "$prefix" ]; then systemctl disable --now edge-agent.service || true; else "${systemctl_root[@]}" disable edge-agent.service; fi
    rm -f "$unit"
    [ -n "$prefix" ] || systemctl daemon-reload
    say "removed the service"
  fi
  rm -rf "$prefix/opt/edge-agent" "$etc"
  if has_user edge-agent; then userdel "${shadow_root[@]}" edge-agent; say "removed the user edge-agent"; fi
  say "removed /opt/edge-agent and /etc/edge-agent; kept the state directory $state (rm -rf it to forget the installed versions)"
  exit 0
fi

# 0. Python and the system, before anything is written -----------------------------------
# a minimal Debian (debootstrap, a fresh Raspberry Pi OS Lite image) has no python3 or no venv module
if ! { command -v "$python" >/dev/null && "$python" -c 'import ensurepip, venv' 2>/dev/null; }; then
  if [ -z "$prefix" ] && [ "$python" = python3 ] && command -v "$apt_get" >/dev/null; then
    say "installing python3 and python3-venv (apt-get): this system has no Python with its venv module"
    DEBIAN_FRONTEND=noninteractive "$apt_get" update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive "$apt_get" install -y -q --no-install-recommends python3 python3-venv >/dev/null
  else
    die "$python with its venv module is missing: install it first (Debian/Ubuntu: apt-get install python3 python3-venv)"
  fi
fi
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || die "$python is older than Python 3.10"
# ONNX Runtime and LiteRT publish wheels for 64-bit ARM and x86 only: a 32-bit system (Raspberry Pi
# OS's armhf image) would fail deep in pip, so it stops here, before anything changes
machine=$("$python" -c 'import platform; print(platform.machine())')
case "$machine" in
  aarch64|arm64|x86_64|amd64) ;;
  *) die "this system is $machine: edge-agent needs a 64-bit one, aarch64 or x86_64 (ONNX Runtime has no wheels for $machine; on a Raspberry Pi, the 64-bit Raspberry Pi OS)" ;;
esac
os_name=$( { sed -n 's/^PRETTY_NAME=//p' "$prefix/etc/os-release" 2>/dev/null || true; } | tr -d '"' | head -n 1)
say "system: ${os_name:-unknown (no /etc/os-release)}, $machine, Python $("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

# 1. the board -----------------------------------------------------------------------------
if [ -z "$board" ]; then
  model=$(tr -d '\0' < "$prefix/proc/device-tree/model" 2>/dev/null || true)
  if [ -f "$prefix/etc/nv_tegra_release" ] || [[ "$model" == *Jetson* ]]; then board=jetson
  elif [[ "$model" == *"Raspberry Pi"* ]]; then board=rpi
  else board=generic; fi
fi
case "$board" in
  jetson) extras="[jetson]"; site=(--system-site-packages) ;;
  rpi) extras="[rpi]"; site=() ;;
  generic) extras=""; site=() ;;
  *) die "--board must be jetson, rpi or generic, not $board" ;;
esac
say "board: $board${model:+ ($model)}"

# 2. the user and the groups ---------------------------------------------------------------
for group in video gpio i2c render; do
  has_group "$group" || { groupadd "${shadow_root[@]}" --system "$group"; say "created the group $group"; }
done
if ! has_user edge-agent; then
  useradd "${shadow_root[@]}" --system --user-group --home-dir /var/lib/edge-agent --no-create-home \
    --shell /usr/sbin/nologin --comment "edge-agent service" edge-agent
  say "created the user edge-agent"
fi

# 3. the venv and the package --------------------------------------------------------------
if [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "${site[@]}" "$venv"
  say "created the venv $venv${site:+ (with the system's site-packages: JetPack's TensorRT)}"
fi
spec=${spec:-$here}
# shellcheck disable=SC2086 # EDGE_AGENT_PIP_ARGS holds several options on purpose
env -u PYTHONPATH "$venv/bin/python" -m pip install -q --disable-pip-version-check ${EDGE_AGENT_PIP_ARGS:-} --upgrade "$spec$extras"
say "installed $(cd / && env -u PYTHONPATH "$venv/bin/python" -c 'import importlib.metadata as m; print("edge-agent", m.version("edge-agent"))') ${extras:+with $extras}"
[ -f "$here/README.md" ] && install -m 0644 "$here/README.md" "$prefix/opt/edge-agent/README.md"

# 4. the configuration (never overwritten) -------------------------------------------------
install -d -m 0750 "$etc"
chgrp "$(gid_of edge-agent)" "$etc"
if [ -n "$claim" ]; then
  # a claim that does not read stops here, before anything of the configuration changes
  (cd / && "$venv/bin/python" -c 'import sys; from pathlib import Path; from agent.mqtt.enrolment import Claim, EnrolRefused
try: Claim.load(Path(sys.argv[1]))
except EnrolRefused as exc: sys.exit(f"install.sh: --claim: {exc.message}")' "$claim")
  install -m 0600 -o "$(uid_of edge-agent)" -g "$(gid_of edge-agent)" "$claim" "$etc/claim.json"
  say "copied the claim to $etc/claim.json"
fi
if [ -e "$etc/agent.yaml" ] || [ -L "$etc/agent.yaml" ]; then
  say "kept the existing $etc/agent.yaml"
  [ -z "$claim" ] || say "to enrol with the claim, agent.yaml needs enrolment: {claim: /etc/edge-agent/claim.json} and no mqtt: section"
elif [ -n "$claim" ]; then
  camera=${source:-$([ -e "$prefix/dev/video0" ] && echo /dev/video0 || echo synthetic)}
  install -d -m 0750 -o "$(uid_of edge-agent)" -g "$(gid_of edge-agent)" "$state"
  printf '%s\n' \
    "# written by install.sh --claim: on its first start the device asks to join the fleet with the" \
    "# claim and, once the operator approves, adds its broker credentials and keys here (docs/fleet.md)" \
    'state_dir: "/var/lib/edge-agent"' \
    'enrolment:' \
    '  claim: "/etc/edge-agent/claim.json"' \
    'cameras:' \
    '  - name: "cam0"' \
    "    source: \"$camera\"" \
    'status_page:' \
    "  listen: \"$status_listen\"" > "$state/agent.yaml.new"
  chmod 0600 "$state/agent.yaml.new"
  chown "$(uid_of edge-agent):$(gid_of edge-agent)" "$state/agent.yaml.new"
  mv "$state/agent.yaml.new" "$state/agent.yaml"
  ln -s /var/lib/edge-agent/agent.yaml "$etc/agent.yaml"
  say "wrote /var/lib/edge-agent/agent.yaml (linked from $etc/agent.yaml): the device enrols on its first start"
else
  camera=${source:-$([ -e "$prefix/dev/video0" ] && echo /dev/video0 || echo synthetic)}
  "$venv/bin/edge-agent" config example --device-id "${device_id:-$(hostname -s | tr -c 'A-Za-z0-9_.\n-' -)}" \
    --broker "$broker" --state-dir /var/lib/edge-agent --source "$camera" --status-listen "$status_listen" \
    > "$etc/agent.yaml.new"
  chmod 0640 "$etc/agent.yaml.new"
  chgrp "$(gid_of edge-agent)" "$etc/agent.yaml.new"
  mv "$etc/agent.yaml.new" "$etc/agent.yaml"
  say "wrote $etc/agent.yaml: add your trust and operator keys before going to the field (docs/security.md)"
fi

# 5. the service ---------------------------------------------------------------------------
install -D -m 0644 "$here/systemd/edge-agent.service" "$unit"
"${systemctl_root[@]}" enable edge-agent.service 2>/dev/null
if [ -z "$prefix" ]; then
  systemctl daemon-reload
  if [ "$start" = yes ]; then
    systemctl restart edge-agent.service
    say "started: systemctl status edge-agent; journalctl -u edge-agent -f; edge-agent doctor"
  fi
else
  say "installed into $prefix (nothing started)"
fi
