#!/usr/bin/env bash
# Give the user's Ansible the few settings the checkout's ansible.cfg has, so the collection's
# playbooks print the same from any directory and from an installed collection: no "No inventory
# was parsed" / "provided hosts list is empty" warnings for the controller-only playbooks, and
# multi-line results as YAML. Writes ~/.ansible.cfg only when there is none; otherwise says which
# lines it would add. (The checkout's own ansible.cfg wins when run from the repository root.)
set -euo pipefail
config=${ANSIBLE_USER_CONFIG:-$HOME/.ansible.cfg}
settings='[defaults]
localhost_warning = false
callback_result_format = yaml

[inventory]
inventory_unparsed_warning = false'
if [ -e "$config" ]; then
  missing=$(printf '%s\n' "$settings" | grep ' = ' | while read -r key _; do grep -q "^$key" "$config" || echo "$key"; done)
  if [ -n "$missing" ]; then
    printf 'ansible-user-config: %s exists; add these settings to it by hand:\n%s\n' "$config" "$settings" >&2
  fi
  exit 0
fi
printf '# Written by agentbox.box scripts/ansible-user-config.sh\n%s\n' "$settings" > "$config"
echo "ansible-user-config: wrote $config" >&2
