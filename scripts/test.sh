#!/usr/bin/env bash
# The whole test suite, as CI runs it: set-up, then every test against the real engine with the
# quality gates running beside it. Usage: scripts/test.sh [pytest args...]   (AGENTBOX_SKIP_GATES=1
# runs only pytest, and then the run never reports "all steps passed": the quality gates did not run)
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=$PWD/.venv/bin:$PATH ANSIBLE_CONFIG=$PWD/ansible.cfg ANSIBLE_NOCOLOR=1 PY_COLORS=0
# The relay a create starts (molecule's included) must not pause other tests' boxes: its idle policy
# is off for the whole run (tests/integration/idle/test_autopause_relay.py turns it on for its own relay).
export AGENTBOX_IDLE_INTERVAL=0

# One suite at a time on this machine: two at once measure the machine, not the code (2 cores).
suite_lock=${AGENTBOX_SUITE_LOCK:-/tmp/agentbox-suite.lock}
exec 9>"$suite_lock"
if ! flock -n 9; then
  echo "test: another suite is running on this machine (lock $suite_lock); waiting for it to end..."
  flock 9
  echo "test: the other suite ended; starting"
fi
run_started=$SECONDS

failed=()
watchers=()
step() {  # step NAME COMMAND...: run, time, remember failures, go on with the next step
  local name=$1 started=$SECONDS
  shift
  echo "=== $name"
  if "$@"; then
    echo "=== $name: ok ($((SECONDS - started)) s)"
  else
    echo "=== $name: FAILED ($((SECONDS - started)) s)"
    failed+=("$name")
  fi
}

# The checkout's collection link farm must stay links (an installer writing a copy there would
# shadow the checkout with stale files).
for farm in .collections playbooks/collections; do
  if [ ! -L "$farm/ansible_collections/agentbox/box/plugins" ]; then
    echo "test: $farm/ansible_collections/agentbox/box is not the checkout's link farm; run: git checkout -- $farm" >&2
    exit 1
  fi
done

# Set-up: without these nothing else can run, so a failure stops here.
setup_step() {  # setup_step NAME COMMAND...: like step, but a failure ends the run here
  local name=$1 started=$SECONDS
  shift
  echo "=== set-up: $name"
  if ! "$@"; then
    echo "=== set-up: $name: FAILED after $((SECONDS - started)) s; nothing else can run"
    exit 1
  fi
  echo "=== set-up: $name: ok ($((SECONDS - started)) s)"
}
setup_step "venv" bash scripts/setup-venv.sh
setup_step "docker engine" bash scripts/ensure-docker.sh
# Boxes live on the box engine (ensure-docker.sh starts it): every docker CLI and SDK of the run
# (tests, molecule, emulators) reaches that engine, as the collection does for isolated boxes.
export DOCKER_HOST=${AGENTBOX_ENGINE:-unix:///run/agentbox-engine/docker.sock}
setup_step "browser" bash scripts/ensure-browser.sh
setup_step "box image" ansible-playbook playbooks/build_image.yml

# The quality gates run beside pytest, one after another in the background: pytest alone leaves about a
# quarter of the two cores idle (it waits on the engine, SSH and boxes booting), which the gates fill.
# Each gate's output goes to its own file and is printed, with its verdict, when pytest has ended.
gate_dir=$(mktemp -d /tmp/agentbox-gates.XXXXXX)
gates_pid=
if [ "${AGENTBOX_SKIP_GATES:-0}" != 1 ]; then
  gate() {  # gate NAME COMMAND...: like step, into $gate_dir (NN.name, NN.log, and NN.rc when it ended)
    local name=$1 log started=$SECONDS rc=0
    shift
    log=$gate_dir/$(printf '%02d' "$(find "$gate_dir" -name '*.log' | wc -l)")
    echo "$name" >"$log.name"
    "$@" >"$log.log" 2>&1 </dev/null || rc=$?
    echo "$rc $((SECONDS - started))" >"$log.rc"
  }
  (
    # sanity first: it copies the checkout as it is at the start (tests may make files there for a while).
    gate "ansible-test sanity" bash scripts/sanity.sh
    gate "ruff" ruff check .  # every Python file, in-box programs included (ruff.toml extend-include)
    gate "ansible-lint" ansible-lint --offline playbooks roles
    for scenario in roles/*/molecule/default; do
      role_dir=${scenario%/molecule/default}
      gate "molecule ${role_dir#roles/}" bash -c "cd '$role_dir' && molecule test"
    done
  ) &
  gates_pid=$!
  echo "=== quality gates: started beside pytest (ruff, ansible-lint, ansible-test sanity, molecule); reported after it"
fi
gates_report() {  # print each gate's output and verdict, in the order they ran; a gate that left no verdict failed
  local log name rc seconds
  [ -n "$gates_pid" ] || return 0
  wait "$gates_pid"
  for log in "$gate_dir"/*.log; do
    name=$(cat "${log%.log}.name")
    echo "=== $name"
    cat "$log"
    if [ -s "${log%.log}.rc" ] && read -r rc seconds <"${log%.log}.rc" && [ "$rc" = 0 ]; then
      echo "=== $name: ok ($seconds s, beside pytest)"
    else
      echo "=== $name: FAILED (${seconds:-?} s, beside pytest)"
      failed+=("$name")
    fi
  done
}

# pytest: exit 5 (no tests) counts as a failure; the gates' verdicts follow it, then the counts.
# Two workers (much of the suite waits on the engine, SSH and subprocesses); a module's tests stay
# on one worker, so a module's expensive shared fixtures (emulator, engine fleet) are made once.
# Module order and the order of tests in each module are shuffled (the seed is printed: rerun
# with -p random_order --random-order-seed=N); tests must not depend on each other.
# The run's cost, counted: every ansible, ansible-playbook and ansible-inventory process that pytest
# starts (tests run them by the venv's path: a .pth line in the venv, there only for this step, notes
# each start when AGENTBOX_COUNT_DIR is set) and every box container made on the local engines.
count_dir=$(mktemp -d /tmp/agentbox-counts.XXXXXX)
count_pth=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/agentbox-count-processes.pth
cat >"$count_pth" <<'PTH'
import os; _d = os.environ.get("AGENTBOX_COUNT_DIR"); _a = _d and open("/proc/self/cmdline", "rb").read().split(b"\0"); _p = _a and len(_a) > 1 and os.path.basename(_a[1].decode(errors="replace")); _p in ("ansible", "ansible-playbook", "ansible-inventory") and open(os.path.join(_d, "ansible"), "a").write(f"{os.getpid()} {_p} {os.environ.get('PYTEST_CURRENT_TEST', '-').split('::')[0]}\n")
PTH
# The payload cache (tests/integration/support/ansiballz_cache.py): each Ansible process of the step finds an
# agentbox module's module_utils once per run instead of once per process (about 0.5 core-s each).
cache_pth=${count_pth%/*}/agentbox-ansiballz-cache.pth
cat >"$cache_pth" <<PTH
import os; os.environ.get("AGENTBOX_ANSIBALLZ_CACHE") and exec(compile(open("$PWD/tests/integration/support/ansiballz_cache.py").read(), "ansiballz_cache.py", "exec"), {"__name__": "agentbox_ansiballz_cache"})
PTH
mkdir -m 700 "$count_dir/ansiballz"
trap 'rm -f "$count_pth" "$cache_pth"' EXIT
# Streamed as they happen (the engine keeps only its last 256 events for --since).
user_engine=unix:///run/docker.sock
for engine in box:"$DOCKER_HOST" user:"$user_engine"; do
  docker -H "${engine#*:}" events --filter type=container --filter event=create \
    --format '{{index .Actor.Attributes "io.agentbox.box"}}' >"$count_dir/created.${engine%%:*}" 2>/dev/null &
  watchers+=($!)
done
# The machine's busy CPU over the step (user, system, irq: not idle, iowait or steal; every process on the
# machine): steadier than the wall time between runs, and what the suite's speed depends on (it is CPU-bound).
busy_ticks() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8}' /proc/stat; }
busy_before=$(busy_ticks)
AGENTBOX_COUNT_DIR=$count_dir AGENTBOX_ANSIBALLZ_CACHE=$count_dir/ansiballz step "pytest" pytest -p no:cacheprovider -n "${AGENTBOX_TEST_WORKERS:-2}" --dist loadfile \
  -p random_order --random-order-bucket=module --durations=10 "$@"
busy_after=$(busy_ticks)
gates_report
kill "${watchers[@]}" 2>/dev/null
rm -f "$count_pth" "$cache_pth"
wait "${watchers[@]}" 2>/dev/null
rm -rf "$gate_dir"
boxes() { grep -c . "$1" 2>/dev/null || true; }  # lines naming a box (other containers print an empty line)
# One line a process (a venv may list its site-packages twice: the same pid then writes two).
sort -u "$count_dir/ansible" 2>/dev/null | awk '{print $2}' >"$count_dir/ansible.once"
echo "=== counts: ansible processes $(grep -c . "$count_dir/ansible.once")" \
  "($(sort "$count_dir/ansible.once" | uniq -c | awk '{printf "%s %s, ", $1, $2}' | sed 's/, $//'))"
# Which test modules start them (pytest's PYTEST_CURRENT_TEST reaches every process a test starts).
echo "=== counts: ansible processes by test module (the ten most):"
sort -u "$count_dir/ansible" 2>/dev/null | awk '{print $3}' | sort | uniq -c | sort -rn | head -10
echo "=== counts: boxes created $(( $(boxes "$count_dir/created.box") + $(boxes "$count_dir/created.user") ))" \
  "(box engine $(boxes "$count_dir/created.box"), user's engine $(boxes "$count_dir/created.user"));" \
  "containers created in all $(( $(wc -l <"$count_dir/created.box") + $(wc -l <"$count_dir/created.user") ))"
rm -rf "$count_dir"
echo "=== counts: busy CPU during pytest $(( (busy_after - busy_before) / $(getconf CLK_TCK) )) core-s" \
  "(the gates beside it included; $(nproc) cores)"
echo "=== wall time: $((SECONDS - run_started)) s"

if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED steps: ${failed[*]}"
  exit 1
fi
if [ "${AGENTBOX_SKIP_GATES:-0}" = 1 ]; then
  echo "pytest passed; NOT a full pass: AGENTBOX_SKIP_GATES=1 skipped ruff, ansible-lint, sanity and molecule"
  exit 0
fi
echo "all steps passed"
