#!/usr/bin/env bash
# Install the Debian tools the operations tests run (tests/ops):
#   systemd-analyze, systemd-sysusers, systemd-tmpfiles  <- package "systemd"
#   promtool                                             <- package "prometheus"
#   fusermount3 (and libfuse3)                           <- package "fuse3"
#     for scripts/slowfs.py, the throttled FUSE mount (save-storm benchmark, tier tests)
#   etcd                                                 <- package "etcd-server"
#     the fleet's coordination engine (tests/fleet start one on loopback)
# Idempotent and quiet: a tool already on PATH is not reinstalled, and nothing is
# done when everything is present. Needs root (or sudo) only when something is missing.
# Usage: scripts/install-test-deps.sh        (called from .ci/run before `make test`)
set -euo pipefail

declare -A want=(
  [systemd-analyze]=systemd
  [systemd-sysusers]=systemd
  [systemd-tmpfiles]=systemd
  [promtool]=prometheus
  [fusermount3]=fuse3
  [etcd]=etcd-server
)

missing=()
for tool in "${!want[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("${want[$tool]}")
done
# de-duplicate package names
mapfile -t missing < <(printf '%s\n' "${missing[@]+"${missing[@]}"}" | sort -u | sed '/^$/d')
[ "${#missing[@]}" -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-test-deps: apt-get not found; install ${missing[*]} by hand" >&2
  exit 1
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo="sudo -n"; else
    echo "install-test-deps: need root to install ${missing[*]}" >&2
    exit 1
  fi
fi

log="$(mktemp -t adaptd-apt.XXXXXX)"
trap 'rm -f "$log"' EXIT
export DEBIAN_FRONTEND=noninteractive
if ! { $sudo apt-get update -qq \
  && $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  echo "install-test-deps: installing ${missing[*]} failed:" >&2
  tail -n 20 "$log" >&2
  exit 1
fi
echo "install-test-deps: installed ${missing[*]}"
