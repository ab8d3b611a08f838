#!/usr/bin/env bash
# Make sure the box engine answers: the Docker daemon the collection starts and owns for boxes.
#
# Root in a box must be nobody on the host. Docker's user-namespace remapping does that, but it is
# daemon-wide, so boxes get a daemon of their own (Debian's docker.io, the same package as the
# user's engine) and the user's engine is never reconfigured:
#   --userns-remap            root in a box is uid 100000+ on the host (agentbox-remap in /etc/subuid)
#   own socket, data root, exec root, pid file, config file   (nothing shared with the user's engine)
#   own bridge (agentbox0), --iptables=false, own iptables chains (AGENTBOX-*)   (docker0 untouched)
#   a network for boxes with an egress policy (agentbox-egress, bridge agentbox1) whose traffic may not
#     leave it nor reach this host, only answer connections the host opened (published ports): the
#     box's one way out is the egress gateway's socket (docs/egress.md). Made after its rules, each run.
#     Its boxes never reach each other: the runtime makes each of the bridge's ports an isolated one.
#   --cgroup-parent /agentbox-boxes, and an OCI runtime that hands each box its own cgroup
#     (scripts/agentbox-runc: Docker inside a box creates cgroups below its own, nowhere else)
#
# Environment:
#   AGENTBOX_ENGINE            the box engine's address (default unix:///run/agentbox-engine/docker.sock)
#   AGENTBOX_ENGINE_SUBNET     the boxes' bridge network (default 172.30.253.0/24)
#   AGENTBOX_EGRESS_SUBNET     the egress network (default 172.30.252.0/24)
#   AGENTBOX_ENGINE_LOG        the daemon's log (default /var/log/agentbox-engine.log)
#   AGENTBOX_ENGINE_WAIT       seconds to wait for it (default 180)
set -euo pipefail

say() { printf 'ensure-box-engine: %s\n' "$*" >&2; }

run_dir=/run/agentbox-engine
socket=${AGENTBOX_ENGINE:-unix://$run_dir/docker.sock}
data_root=/var/lib/agentbox-engine
config_dir=/etc/agentbox-engine
runtime=/usr/local/libexec/agentbox-engine/agentbox-runc
bridge=agentbox0
subnet=${AGENTBOX_ENGINE_SUBNET:-172.30.253.0/24}
log_file=${AGENTBOX_ENGINE_LOG:-/var/log/agentbox-engine.log}
wait_seconds=${AGENTBOX_ENGINE_WAIT:-180}
here=$(cd "$(dirname "$0")" && pwd)

egress_network=agentbox-egress
egress_bridge=agentbox1
egress_subnet=${AGENTBOX_EGRESS_SUBNET:-172.30.252.0/24}

engine_answers() { DOCKER_HOST=$socket docker info >/dev/null 2>&1; }

# The runtime that delegates each box's cgroup to the box's root and isolates its port on the egress
# bridge (scripts/agentbox-runc). Installed once on each run, so a running engine gets its changes too.
install_runtime() { install -D -m 0755 "$here/agentbox-runc" "$runtime"; }

chain() {  # chain TABLE NAME HOOK [TOOL]: make NAME (empty) and jump to it from HOOK once, first
  local tool=${4:-iptables}
  "$tool" -t "$1" -N "$2" 2>/dev/null || "$tool" -t "$1" -F "$2"
  "$tool" -t "$1" -C "$3" -j "$2" 2>/dev/null || "$tool" -t "$1" -I "$3" 1 -j "$2"
}

# Boxes with an egress policy: nothing from their bridge is forwarded anywhere or taken by this host,
# but the answers on connections the host opened (docker-proxy's, to a published port). Rules the box
# cannot touch (its NET_ADMIN is its own namespace's); the rules first, then the network that says so.
ensure_egress() {
  local tool flag
  # The runtime (install_runtime) isolates each new box's port on the bridge; the ports of boxes already
  # there are isolated now.
  for flag in /sys/class/net/"$egress_bridge"/brif/*/isolated; do
    if [ -e "$flag" ]; then echo 1 > "$flag"; fi
  done
  for tool in iptables ip6tables; do
    command -v "$tool" >/dev/null || continue
    chain filter AGENTBOX-EGRESS-FORWARD FORWARD "$tool"
    "$tool" -A AGENTBOX-EGRESS-FORWARD -i "$egress_bridge" -j DROP
    "$tool" -A AGENTBOX-EGRESS-FORWARD -o "$egress_bridge" -j DROP
    chain filter AGENTBOX-EGRESS-INPUT INPUT "$tool"
    "$tool" -A AGENTBOX-EGRESS-INPUT -i "$egress_bridge" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
    "$tool" -A AGENTBOX-EGRESS-INPUT -i "$egress_bridge" -j DROP
  done
  if ! DOCKER_HOST=$socket docker network inspect "$egress_network" >/dev/null 2>&1; then
    DOCKER_HOST=$socket docker network create --driver bridge --subnet "$egress_subnet" \
      -o com.docker.network.bridge.name="$egress_bridge" -o com.docker.network.bridge.enable_ip_masquerade=false \
      --label agentbox.egress-enforced=1 "$egress_network" >/dev/null
    say "made the egress network $egress_network ($egress_subnet on $egress_bridge)"
  fi
}

if engine_answers; then
  say "box engine answers at $socket"
  if [ "$(id -u)" = 0 ]; then install_runtime; ensure_egress; fi
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  say "the box engine at $socket does not answer, and only root can start it: run 'sudo $0'"
  say "(or create boxes with -e isolation=none on your own engine, without the user-namespace boundary)"
  exit 1
fi
if [ "$socket" != "unix://$run_dir/docker.sock" ]; then
  say "AGENTBOX_ENGINE=$socket does not answer; start that engine, or unset AGENTBOX_ENGINE for the default one"
  exit 1
fi
for tool in dockerd ip iptables; do
  command -v "$tool" >/dev/null || { say "$tool is missing: apt-get install docker.io iproute2 iptables"; exit 1; }
done

# The bridge, with the subnet's first address; kept if it is there already.
gateway=${subnet%.*}.1
prefix=${subnet#*/}
if ! ip link show "$bridge" >/dev/null 2>&1; then
  if ip -4 route show | grep -q "^${subnet%/*}"; then
    say "the subnet $subnet is in use on this machine: set AGENTBOX_ENGINE_SUBNET to a free /24"
    exit 1
  fi
  ip link add "$bridge" type bridge
  ip addr add "$gateway/$prefix" dev "$bridge"
fi
ip link set "$bridge" up

# Forwarding and address translation in chains of our own, hooked once at the top of the built-ins.
# (The user's engine sets FORWARD's policy to DROP; its own chains are never touched.)
# Written only when it is off: in a container /proc/sys is read-only, and it is often on already.
[ "$(cat /proc/sys/net/ipv4/ip_forward)" = 1 ] || sysctl -q -w net.ipv4.ip_forward=1 >/dev/null
chain filter AGENTBOX-FORWARD FORWARD
iptables -A AGENTBOX-FORWARD -o "$bridge" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
iptables -A AGENTBOX-FORWARD -i "$bridge" ! -o "$bridge" -j ACCEPT
iptables -A AGENTBOX-FORWARD -o "$bridge" -j DROP
chain nat AGENTBOX-POSTROUTING POSTROUTING
iptables -t nat -A AGENTBOX-POSTROUTING -s "$subnet" ! -o "$bridge" -j MASQUERADE

# The ids root in a box maps to: a system user of our own with a subordinate range. 165536 ids, not
# 65536: a box may run a user-namespaced Docker engine of its own (Docker's default 100000:65536
# must fit inside the box's ids), as the tests' remote engines do.
remap_user=agentbox-remap
remap_range=100000:165536
if ! getent passwd "$remap_user" >/dev/null; then
  useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$remap_user"
fi
for file in /etc/subuid /etc/subgid; do
  touch "$file"
  if ! grep -q "^$remap_user:" "$file"; then
    printf '%s:%s\n' "$remap_user" "$remap_range" >> "$file"
  fi
done

# Before the daemon starts: its configuration names the runtime.
install_runtime

mkdir -p "$run_dir" "$data_root" "$config_dir"
chmod 0711 "$run_dir"
cat > "$config_dir/daemon.json" <<EOF
{
  "userns-remap": "$remap_user",
  "bridge": "$bridge",
  "iptables": false,
  "ip-masq": false,
  "cgroup-parent": "/agentbox-boxes",
  "runtimes": {"agentbox-runc": {"path": "$runtime"}},
  "default-runtime": "agentbox-runc",
  "storage-driver": "overlay2"
}
EOF

if [ -f "$run_dir/dockerd.pid" ] && kill -0 "$(cat "$run_dir/dockerd.pid")" 2>/dev/null; then
  say "the box engine is starting (pid $(cat "$run_dir/dockerd.pid")); waiting for it"
else
  rm -f "$run_dir/docker.sock"
  mkdir -p "$(dirname "$log_file")"
  say "starting the box engine in the background (log: $log_file)"
  # setsid: the daemon must outlive this script and the shell that ran it.
  setsid nohup dockerd --config-file "$config_dir/daemon.json" --data-root "$data_root" \
    --exec-root "$run_dir/exec" --pidfile "$run_dir/dockerd.pid" -H "$socket" >>"$log_file" 2>&1 </dev/null &
fi
for _ in $(seq "$wait_seconds"); do
  if engine_answers; then
    ensure_egress
    say "box engine answers at $socket (user namespaces: $(DOCKER_HOST=$socket docker info --format '{{.DockerRootDir}}'))"
    exit 0
  fi
  sleep 1
done
say "the box engine did not answer within ${wait_seconds}s. Last lines of $log_file:"
tail -n 20 "$log_file" >&2 || true
exit 1
