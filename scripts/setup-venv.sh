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
      apt-get -o DPkg::Lock::Timeout=300 -o Acquire::Retries=5 update -qq &&
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -o Acquire::Retries=5 \
          install -y -qq python3-venv >/dev/null
      python3 -m venv "$venv"
    else
      echo "setup-venv: python3 -m venv failed; install python3-venv (Debian/Ubuntu) and run again" >&2
      exit 1
    fi
  }
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup-venv: installing requirements.txt into $venv" >&2
  # The index is reached through a proxy that may drop a connection: retry, and once more whole.
  pip_install() { "$venv/bin/pip" install -q --retries 10 "$@"; }
  pip_install --upgrade pip || pip_install --upgrade pip
  pip_install -r requirements.txt || { sleep 5; pip_install -r requirements.txt; }
  echo "$want" > "$stamp"
fi
