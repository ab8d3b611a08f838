#!/usr/bin/env bash
# Make sure a Docker engine answers, and the box engine beside it (scripts/ensure-box-engine.sh).
# Used by the set-up command and by the test command.
#
# - If `docker info` answers (DOCKER_HOST honoured), use that engine and change nothing.
# - Otherwise, as root on Debian/Ubuntu: install Debian's docker.io (plus fuse-overlayfs,
#   debootstrap and openssh-server, which boxes, base images and remote-engine tests use),
#   start dockerd in the background with its log in a file, and wait until it answers.
# - Anywhere else: say what to install and stop.
#
# Environment:
#   AGENTBOX_DOCKERD_LOG      dockerd log file (default /var/log/agentbox-dockerd.log)
#   AGENTBOX_DOCKERD_WAIT     seconds to wait for the engine (default 180: after an unclean stop
#                             dockerd first cleans up every container it had, which takes a while)
set -euo pipefail

log_file=${AGENTBOX_DOCKERD_LOG:-/var/log/agentbox-dockerd.log}
wait_seconds=${AGENTBOX_DOCKERD_WAIT:-180}
# busybox-static: the Daytona emulator's tests build a tiny image from it.
# acl: setfacl lets boxes commit into a root-owned repository.
# rsync: the access tests copy through `rsync -e ssh` over a box's alias.
host_packages=(docker.io fuse-overlayfs debootstrap openssh-server git busybox-static acl rsync iproute2 iptables)

say() { printf 'ensure-docker: %s\n' "$*" >&2; }

engine_answers() { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }

missing_packages() {
  local pkg missing=()
  for pkg in "${host_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  printf '%s\n' "${missing[@]}"
}

is_debian_root() { [ -r /etc/debian_version ] && [ "$(id -u)" = 0 ]; }

if is_debian_root; then
  mapfile -t missing < <(missing_packages)
  if [ "${#missing[@]}" -gt 0 ] && [ -n "${missing[0]}" ]; then
    say "installing ${missing[*]} from Debian's packages"
    export DEBIAN_FRONTEND=noninteractive
    # A fresh machine's own apt jobs may hold the lock for a while; mirrors may drop a request.
    apt-get -o DPkg::Lock::Timeout=300 -o Acquire::Retries=5 update -qq
    apt-get -o DPkg::Lock::Timeout=300 -o Acquire::Retries=5 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

# Boxes run on the box engine (root in a box is nobody on the host): started beside the user's engine.
box_engine() {
  if is_debian_root || [ -n "${AGENTBOX_ENGINE:-}" ]; then
    bash "$(dirname "$0")/ensure-box-engine.sh"
  else
    say "not root: the box engine is not started here (run scripts/ensure-box-engine.sh as root); boxes need isolation=none until then"
  fi
}

if engine_answers; then
  say "engine answers at ${DOCKER_HOST:-unix:///var/run/docker.sock}"
  box_engine
  exit 0
fi
if [ ! -r /etc/debian_version ]; then
  say "no Docker engine answers and this is not Debian/Ubuntu."
  say "Install Docker Engine for your OS (https://docs.docker.com/engine/install/), start it, and run this again."
  exit 1
fi
if [ "$(id -u)" != 0 ]; then
  say "no Docker engine answers. As root run: apt-get install -y ${host_packages[*]} && dockerd &"
  say "or add your user to the 'docker' group of a running engine, then run this again."
  exit 1
fi
if [ -n "${DOCKER_HOST:-}" ] && [ "${DOCKER_HOST}" != "unix:///var/run/docker.sock" ]; then
  say "DOCKER_HOST=${DOCKER_HOST} does not answer. Start that engine, or unset DOCKER_HOST to use a local one."
  exit 1
fi

if ! pgrep -x dockerd >/dev/null 2>&1; then
  mkdir -p "$(dirname "$log_file")"
  say "starting dockerd in the background (log: $log_file)"
  # setsid: dockerd must outlive this script and the shell that ran it.
  setsid nohup dockerd >>"$log_file" 2>&1 </dev/null &
fi

for _ in $(seq "$wait_seconds"); do
  if engine_answers; then
    say "engine answers (storage driver: $(docker info --format '{{.Driver}}'))"
    box_engine
    exit 0
  fi
  sleep 1
done

say "dockerd did not answer within ${wait_seconds}s. Last lines of $log_file:"
tail -n 20 "$log_file" >&2 || true
exit 1
