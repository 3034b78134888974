#!/usr/bin/env bash
# Install the Debian packages of the programs the test suite runs (scripts/test-deps.txt:
# one "PROGRAM PACKAGE" line each). `make test` calls this before pytest.
#
# Idempotent and quick: a program already on PATH is not looked at again, so with
# everything present this only runs `command -v` a few times. Installing needs root
# or passwordless sudo, and apt-get.
#
# Usage: scripts/install-test-deps.sh [--required]
#   default     where something is missing and cannot be installed (no root or sudo,
#               no apt-get, apt-get failed), say what to install and exit 0: the tests
#               that need it skip and name the package.
#   --required  exit 1 instead (CI: .ci/run runs `make test TEST_DEPS=--required`).
set -euo pipefail

list="$(dirname "${BASH_SOURCE[0]}")/test-deps.txt"
required=0
case "${1:-}" in
  --required) required=1 ;;
  "") ;;
  *) echo "usage: $0 [--required]" >&2; exit 2 ;;
esac

missing=()  # packages, each once
while read -r program package _; do
  [[ -z "$program" || "$program" == \#* ]] && continue
  command -v "$program" >/dev/null 2>&1 && continue
  [[ " ${missing[*]-} " == *" $package "* ]] || missing+=("$package")
done <"$list"
[ "${#missing[@]}" -eq 0 ] && exit 0

cannot() {
  echo "install-test-deps: cannot install ${missing[*]}: $1" >&2
  echo "install-test-deps: the tests that need them will be skipped; as root run" \
    "\`apt-get install ${missing[*]}\` (or scripts/install-test-deps.sh)" >&2
  exit "$required"
}

command -v apt-get >/dev/null 2>&1 || cannot "apt-get not found (not Debian or Ubuntu)"
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo=(sudo -n)
  else
    cannot "not root, and no passwordless sudo"
  fi
fi

echo "install-test-deps: installing ${missing[*]} (apt-get)" >&2
log="$(mktemp -t adaptd-apt.XXXXXX)"
trap 'rm -f "$log"' EXIT
export DEBIAN_FRONTEND=noninteractive
if ! { ${sudo[@]+"${sudo[@]}"} apt-get update -qq \
  && ${sudo[@]+"${sudo[@]}"} apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  tail -n 20 "$log" >&2
  cannot "apt-get failed (above)"
fi
echo "install-test-deps: installed ${missing[*]}" >&2
