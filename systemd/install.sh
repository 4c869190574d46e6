#!/usr/bin/env bash
# Install edge-runtime natively with its systemd unit (run as root on the device).
#
#   systemd/install.sh [--wheelhouse DIR] [--dry-run]
#
# Creates the edge-runtime user, a venv in /opt/edge-runtime/venv (from a wheelhouse when given, so
# the CUDA llama.cpp wheel built by build/llama_cpp_cuda.sh is used), /etc/edge-runtime with an
# example config, and enables the unit.
set -euo pipefail
WHEELHOUSE=""
DRY_RUN=0
HERE=$(cd "$(dirname "$0")" && pwd)
while [ $# -gt 0 ]; do
  case "$1" in
    --wheelhouse) WHEELHOUSE=${2:?}; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
run() { echo "+ $*"; if [ "$DRY_RUN" = 0 ]; then "$@"; fi; }

run id -u edge-runtime >/dev/null 2>&1 || run useradd --system --home /var/lib/edge-runtime --shell /usr/sbin/nologin edge-runtime
run install -d -m 0755 /opt/edge-runtime /etc/edge-runtime
run install -d -m 0700 /etc/edge-runtime/credentials
run python3 -m venv /opt/edge-runtime/venv
if [ -n "$WHEELHOUSE" ]; then
  run /opt/edge-runtime/venv/bin/pip install --find-links "$WHEELHOUSE" "$HERE/.."
else
  run /opt/edge-runtime/venv/bin/pip install "$HERE/.."
fi
[ -f /etc/edge-runtime/config.yaml ] || run install -m 0640 "$HERE/config.example.yaml" /etc/edge-runtime/config.yaml
for cred in mqtt_password api_token; do
  [ -f "/etc/edge-runtime/credentials/$cred" ] || run install -m 0600 /dev/null "/etc/edge-runtime/credentials/$cred"
done
run install -m 0644 "$HERE/edge-runtime.service" /etc/systemd/system/edge-runtime.service
run systemctl daemon-reload
run systemctl enable --now edge-runtime.service
