"""`ssh agentbox-<box> true`: what a login into a box costs, with the real OpenSSH client.

Makes a box on the local engine and a box on a test engine (a container with sshd and dockerd
reached through a 127.0.0.1 port, see tests/integration/support/engines.py), with a temporary HOME (its
own key, ~/.agentbox/ssh_config), then times, interleaved run by run so load drift hits all alike:

  local   ssh agentbox-<local box> true          (ProxyCommand: docker exec ... sshd -i)
  exec    docker exec <local box> true            (the floor the ProxyCommand builds on)
  engine  ssh <test engine> true                  (a plain SSH login to the engine itself)
  remote  ssh agentbox-<box on the engine> true   (through the engine, its connection shared)
  cold    the same after `ssh -O exit` closed the shared engine connection

Prints medians, the remote/engine ratios, the load average before and after, and each of issue 16's
figures as met or not (local <= 0.3 s median; remote <= 1.5x engine). Everything it makes is removed
at the end.

    .venv/bin/python benchmarks/access.py [--runs 15] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for entry in (str(REPO), str(REPO / ".collections")):
    if entry not in sys.path:
        sys.path.insert(0, entry)

from tests.integration.support.engines import EngineFleet  # noqa: E402

IMAGE = "agentbox/box:latest"
LOCAL_TARGET_S = 0.3  # issue 16: `ssh agentbox-<local box> true`, median
REMOTE_TARGET = 1.5  # issue 16: a box on an engine over `ssh <engine> true`


def timed(argv: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, timeout=120)
    return time.perf_counter() - began


def make_workspace(root: Path) -> Path:
    repo = root / "ws"
    repo.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x.invalid"}
    env |= {"GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@x.invalid"}
    for argv in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "i"]):
        if argv[0] == "add":
            (repo / "README.md").write_text("bench\n")
        subprocess.run(["git", "-C", str(repo), *argv], check=True, env=env)
    return repo


def remove_boxes(made: list) -> None:
    from ansible_collections.agentbox.box.plugins.module_utils.box import _box

    while made:
        provider, name = made.pop()
        try:
            facts = provider.find(name)
            if facts:
                _box.destroy_box(provider, facts)
        except Exception as exc:  # noqa: BLE001 - clean up what can be, report the rest
            print(f"could not remove {name}: {exc}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="abb-", dir="/tmp"))
    os.environ["HOME"] = str(home)
    os.environ.pop("SSH_AUTH_SOCK", None)
    (home / ".ssh").mkdir(mode=0o700)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / ".ssh/id_ed25519")], check=True)
    work = Path(tempfile.mkdtemp(prefix="abb-ws-"))
    os.chmod(work, 0o755)

    from ansible_collections.agentbox.box.plugins.module_utils.access import _access
    from ansible_collections.agentbox.box.plugins.module_utils.box import _box
    from ansible_collections.agentbox.box.plugins.module_utils.providers.docker import _image_transfer
    from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._docker import DockerProvider

    token = secrets.token_hex(3)
    local_name, remote_name = f"bench-ssh-{token}", f"bench-ssh-r-{token}"
    config = str(home / ".agentbox" / "ssh_config")
    local = DockerProvider()
    made: list[tuple[DockerProvider, str]] = []
    figures: dict[str, object] = {"runs": args.runs, "load_average_start": round(os.getloadavg()[0], 2)}
    try:
        with EngineFleet(count=1, tmpfs_size="3g") as fleet:
            try:
                engine = fleet.engines[0]
                remote = DockerProvider(engine=engine.alias, ssh_options={}, isolation="none")
                _image_transfer.ensure_image(remote, IMAGE, compress=False)
                workspace = make_workspace(work)
                subprocess.run(["chown", "-R", "1000:1000", str(workspace)], check=False)
                for provider, name in ((local, local_name), (remote, remote_name)):
                    made.append((provider, name))
                    created = _box.create_box(provider, _box.CreateRequest(name=name, workspace=str(workspace)))
                    assert created.access and not created.access.get("warnings"), created.access
                ssh = ["ssh", "-F", config, "-o", "BatchMode=yes"]
                engine_ssh = ["ssh", "-F", fleet.ssh_config, "-o", "BatchMode=yes", engine.alias, "true"]
                commands = {
                    "local": [*ssh, _access.alias(local_name), "true"],
                    "exec": ["docker", "exec", f"agentbox-{local_name}", "true"],
                    "engine": engine_ssh,
                    "remote": [*ssh, _access.alias(remote_name), "true"],
                }
                for argv in commands.values():  # warm caches (and the shared engine connection)
                    timed(argv)
                samples: dict[str, list[float]] = {key: [] for key in [*commands, "cold"]}
                for _run in range(args.runs):
                    for key, argv in commands.items():
                        samples[key].append(timed(argv))
                    control_dir = home / ".agentbox" / "cm"
                    for socket_file in control_dir.iterdir() if control_dir.exists() else []:
                        # The shared engine connection's socket: close it, so the next login is cold.
                        subprocess.run(
                            ["ssh", "-S", str(socket_file), "-O", "exit", "x"], capture_output=True, check=False
                        )
                    samples["cold"].append(timed(commands["remote"]))
                    timed(commands["remote"])  # opens the shared connection again for the next warm run
                for key, values in samples.items():
                    figures[f"{key}_median_s"] = round(statistics.median(values), 3)
                figures["remote_over_engine"] = round(
                    statistics.median(samples["remote"]) / statistics.median(samples["engine"]), 2
                )
                figures["cold_over_engine"] = round(
                    statistics.median(samples["cold"]) / statistics.median(samples["engine"]), 2
                )
                figures["load_average"] = round(os.getloadavg()[0], 2)
                local_s = statistics.median(samples["local"])
                figures["local_target_met"] = local_s <= LOCAL_TARGET_S
                figures["remote_target_met"] = figures["remote_over_engine"] <= REMOTE_TARGET  # type: ignore[operator]
            finally:
                remove_boxes(made)
    finally:
        remove_boxes(made)
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    for key, value in figures.items():
        print(f"{key:>22}: {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
