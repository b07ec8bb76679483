#!/usr/bin/env bash
# The agent on a booted Debian 12 VM: install.sh, the unit under a real systemd (READY, watchdog,
# reload, restarts, reboot), a kernel camera (vivid), a signed push through probation, enrolment
# by claim, the agent's own update and its rollback, uninstall.
#   scripts/vm_test.sh [--arch amd64|arm64] [--json] [--keep] [exec CMD... | stop]
# Needs root (debootstrap), qemu-system-x86 / qemu-system-arm, debootstrap, qemu-utils,
# mosquitto-clients (mosquitto_ctrl for enrol_claim's broker) and this checkout's venv for the
# operator's CLI (scripts/setup.sh dev). Details: scripts/vm_test.py and
# docs/service.md ("What was seen on a booted system").
set -euo pipefail
exec python3 "$(dirname "$0")/vm_test.py" "$@"
