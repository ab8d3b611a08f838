#!/usr/bin/env bash
# Make sure a headless browser is there for the tests that render pages (tests/integration/fleet/test_fleet_status.py).
# Installs Debian's chromium as root on Debian/Ubuntu when it is missing; anywhere else says what to install.
# Tests never install packages themselves: scripts/test.sh runs this during set-up.
set -euo pipefail

say() { printf 'ensure-browser: %s\n' "$*" >&2; }

if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
if [ -r /etc/debian_version ] && [ "$(id -u)" = 0 ]; then
  say "installing Debian's chromium"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=300 -o Acquire::Retries=5 update -qq
  apt-get -o DPkg::Lock::Timeout=300 -o Acquire::Retries=5 install -y -qq --no-install-recommends chromium >/dev/null
  command -v chromium >/dev/null 2>&1 && exit 0
  say "chromium was installed but is not on PATH"
  exit 1
fi
say "no chromium on PATH: install your distribution's chromium package (as root on Debian: apt-get install chromium)"
exit 1
