#!/usr/bin/env bash
# Create ./.venv with the pinned dependencies (requirements.txt). Re-running is a no-op
# unless requirements.txt changed since the last install.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv
stamp=$venv/.requirements.sha256
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" 2>/dev/null || {
    if [ "$(id -u)" = 0 ] && [ -r /etc/debian_version ]; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
      python3 -m venv "$venv"
    else
      echo "setup-venv: python3 -m venv failed; install python3-venv (Debian/Ubuntu) and run again" >&2
      exit 1
    fi
  }
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup-venv: installing requirements.txt into $venv" >&2
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q -r requirements.txt
  echo "$want" > "$stamp"
fi
