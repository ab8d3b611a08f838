#!/usr/bin/env bash
# ansible-test sanity for the collection, run from a temporary ansible_collections/agentbox/box
# copy of the checkout (ansible-test needs that layout) with the venv's Python 3.11.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
py=$root/.venv/bin/python

# ansible-test bootstraps pip in its venvs with get-pip.py from a host this machine cannot
# reach, but first looks in its cache: a stand-in there installs pip from the stdlib's
# ensurepip and then what it was asked for, from the package index that pip reaches.
pip_version=$("$py" - <<'PY'
from ansible_test._internal.python_requirements import get_venv_packages
from ansible_test._internal.host_configs import NativePythonConfig
print(get_venv_packages(NativePythonConfig(version="3.11", path="/usr/bin/python3"))["pip"])
PY
)
cache=~/.ansible/test/cache/get_pip_${pip_version//./_}.py
if [ ! -s "$cache" ]; then
  mkdir -p "$(dirname "$cache")"
  cat >"$cache" <<'PY'
"""Stand-in for get-pip.py (written by agentbox.box scripts/sanity.sh)."""
import subprocess
import sys

args = [arg for arg in sys.argv[1:] if arg not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade"])
subprocess.check_call([sys.executable, "-m", "pip", "install", *args])
PY
fi

work=$(mktemp -d /tmp/agentbox-sanity.XXXXXX)
trap 'rm -rf "$work"' EXIT
dest=$work/ansible_collections/agentbox/box
mkdir -p "$dest"
# What git tracks plus new files it does not ignore; the checkout's own collection links are left out.
git ls-files -z -co --exclude-standard \
  | grep -zv -e '^\.collections/' -e '^playbooks/collections/' \
  | (cd "$root" && xargs -0 cp --parents -P -t "$dest")
cd "$dest"
git init -q . && git add -A >/dev/null
"$root/.venv/bin/ansible-test" sanity --requirements --python 3.11 --color no "$@"
