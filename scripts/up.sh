#!/usr/bin/env bash
# One command from a fresh Debian/Ubuntu machine to a box:
#   scripts/up.sh [WORKSPACE] [extra ansible-playbook args, e.g. -e box=NAME]
# Sets up ./.venv with the pinned dependencies, installs the collection, makes sure a Docker
# engine answers (installing and starting one when none does), builds the box image when it is
# missing or out of date, then creates a box for WORKSPACE (default: the current directory)
# and prints how to get a shell in it.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
workspace=${1:-$PWD}
[ $# -gt 0 ] && shift
workspace=$(cd "$workspace" && pwd) || { echo "up: $workspace is not a directory" >&2; exit 1; }

cd "$here"
bash scripts/setup-venv.sh
export PATH=$here/.venv/bin:$PATH ANSIBLE_CONFIG=$here/ansible.cfg

# The collection itself, for playbooks run from anywhere (the checkout works without it too).
version=$(python - <<'PY'
import yaml
print(yaml.safe_load(open("galaxy.yml"))["version"])
PY
)
build_dir=$(mktemp -d)
trap 'rm -rf "$build_dir"' EXIT
ansible-galaxy collection build --force --output-path "$build_dir" . >/dev/null
# -p: the first collections_path entry is the checkout's own link farm (.collections), not for installs.
ansible-galaxy collection install --force -p ~/.ansible/collections "$build_dir/agentbox-box-$version.tar.gz" >/dev/null
echo "up: collection agentbox.box $version installed"
# The same quiet output from any directory (a ~/.ansible.cfg, only when there is none).
bash scripts/ansible-user-config.sh

bash scripts/ensure-docker.sh
ansible-playbook playbooks/build_image.yml
cd "$workspace"
PWD=$workspace ansible-playbook "$here/playbooks/create_box.yml" -e "workspace=$workspace" "$@"
