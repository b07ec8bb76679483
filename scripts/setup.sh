#!/usr/bin/env bash
# Create .venv and install edge-agent into it (editable). `scripts/setup.sh dev` adds the
# test and lint tools, and Debian's chromium and systemd (systemd-analyze) for the status page
# and service tests, prometheus (with promtool) and prometheus-mqtt-exporter for
# deploy/prometheus/, gst-launch-1.0 (with y4menc) and ffmpeg, whose pipe sources the tests run
# for real. Installs Debian's python3-venv
# first when this Python lacks venv, and the mosquitto broker and clients that the demo and the
# tests start on a free port.
set -euo pipefail
cd "$(dirname "$0")/.."
extra=${1:-}
python=${PYTHON:-python3}

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
apt_updated=no
apt_install() {
  echo "installing $* (Debian/Ubuntu)" >&2
  [ "$apt_updated" = yes ] || { as_root apt-get update -qq; apt_updated=yes; }
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}

"$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || { echo "edge-agent needs Python >= 3.10 ($python is $("$python" -V 2>&1))" >&2; exit 1; }

if [ ! -x .venv/bin/python ]; then
  if ! "$python" -m venv .venv 2>/dev/null; then
    rm -rf .venv
    apt_install python3-venv
    "$python" -m venv .venv
  fi
fi
have_mosquitto() { command -v mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ]; }
if ! have_mosquitto || ! command -v mosquitto_sub >/dev/null; then
  apt_install mosquitto mosquitto-clients
fi
# the tests of the status page drive Debian's headless chromium; the unit's tests run systemd-analyze
if [ "$extra" = dev ]; then
  command -v chromium >/dev/null || command -v chromium-browser >/dev/null || apt_install chromium
  command -v systemd-analyze >/dev/null || apt_install systemd
  # the Prometheus tests: promtool checks the alert rules, a real prometheus scrapes agents, and
  # scrapes prometheus-mqtt-exporter for the devices behind NAT (deploy/prometheus/mqtt-exporter.yaml)
  command -v promtool >/dev/null || apt_install --no-install-recommends prometheus
  command -v prometheus-mqtt-exporter >/dev/null || apt_install --no-install-recommends prometheus-mqtt-exporter
fi
if [ "$extra" = dev ] && { ! command -v gst-launch-1.0 >/dev/null || ! command -v ffmpeg >/dev/null \
  || ! gst-inspect-1.0 y4menc >/dev/null 2>&1; }; then
  apt_install --no-install-recommends gstreamer1.0-tools gstreamer1.0-plugins-base gstreamer1.0-plugins-good ffmpeg
fi
.venv/bin/python -m pip install -q --upgrade pip
if [ "$extra" = dev ]; then
  # the openvino and nncf extras too, so that its backend and the OpenVINO INT8 variant are tested (CI runs this)
  .venv/bin/python -m pip install -q -e ".[dev,openvino,nncf]"
  .venv/bin/python -m pip install -q --no-deps -e tests/support  # testkit: what tests and bench/ share
else
  .venv/bin/python -m pip install -q -e .
fi
# the Home Assistant test (tests/e2e/test_home_assistant.py): a real HA core in a side environment
# of its own (its pinned dependencies clash with ours), with the requirements of the integrations
# it loads pre-installed: the test runs hass --skip-pip, so HA never installs at run time (uv, from
# the dev tools: a minute where pip takes six)
HA_VERSION=2024.3.3  # the newest release that runs on Python 3.11
if [ "$extra" = dev ] && ! build/ha-env/bin/python -c "import homeassistant.const as c; import sys; sys.exit(c.__version__ != '$HA_VERSION')" 2>/dev/null \
  && "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  rm -rf build/ha-env && mkdir -p build && "$python" -m venv build/ha-env
  .venv/bin/uv pip install -q --python build/ha-env/bin/python "homeassistant==$HA_VERSION" paho-mqtt==1.6.1 Pillow==10.2.0 janus==1.0.0 \
    psutil-home-assistant==0.0.1 SQLAlchemy==2.0.27 fnv-hash-fast==0.5.0 \
    home-assistant-frontend==20240307.0 securetar==2024.2.1 josepy==1.14.0 numpy==1.26.0
fi
