"""What crash-safe create adds to one create, step by step, on the real engine (issue 12).

  .venv/bin/python benchmarks/crash_safe.py [--runs N]

Measured on one seeded box, each step repeated N times, medians printed in ms:
  journal   claim the name's lock, the five atomic stage writes of a create, forget, release
  leftovers the volume listing by label that finds a hand-removed box's leftovers
  record    the seed record written in its own exec after the untracked files (only when there are some)
  sweep     the scan of the temp directory for index copies of killed runs
  half-made the seed-record read a re-run of create makes on an existing running box
and, for scale, the median of the agentbox_box create task itself (boot off) over the same runs.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# tests.conftest first: it installs Ansible's collection loader, which the collection's lazy imports need.
from tests.conftest import chown_tree, make_repo  # noqa: E402, I001

from ansible_collections.agentbox.box.plugins.module_utils.box import _box  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.core import _journal  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.git import _git, _seed  # noqa: E402
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker import _docker  # noqa: E402


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def timed(step, runs: int) -> list[float]:
    samples = []
    for _run in range(runs):
        started = time.perf_counter()
        step()
        samples.append(time.perf_counter() - started)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    provider = _docker.DockerProvider()
    root = Path(tempfile.mkdtemp(prefix="agentbox-bench-cs-"))
    root.chmod(0o755)
    workspace = make_repo(root / "ws", {"README.md": "hello\n", "src/app.py": "print(1)\n"})
    (workspace / "notes.txt").write_text("untracked\n")
    chown_tree(workspace)
    creates: list[float] = []
    names: list[str] = []
    try:
        for _run in range(args.runs):
            name = f"bench-cs-{secrets.token_hex(3)}"
            names.append(name)
            started = time.perf_counter()
            _box.create_box(provider, _box.CreateRequest(name=name, workspace=str(workspace), boot=False))
            creates.append(time.perf_counter() - started)
        box = names[0]  # its journal's lock file exists already: the claims below add no file

        def journal() -> None:
            entry = _journal.Journal("docker", "local", box)
            entry.claim()
            for stage in ("reserving", "reserved", "creating", "seeding", "booting"):
                entry.write(stage=stage, box=box)
            entry.forget()
            entry.release()

        result = _seed.SeedResult(mode="worktree", branch="b", base_commit="c")
        steps = {
            "journal": journal,
            "leftovers": lambda: provider.remove_leftover_volumes(f"bench-cs-none-{secrets.token_hex(3)}"),
            "record": lambda: _seed.finish(provider, box, None, result),
            "sweep": _git.sweep_dead_index_copies,
            "half-made": lambda: _seed.read_seed_record(provider, box),
        }
        print(f"create task (boot off), median of {args.runs}: {median_ms(creates):8.1f} ms")
        total = 0.0
        for label, step in steps.items():
            value = median_ms(timed(step, args.runs))
            # A worktree seed's record rides at the end of its untracked upload (no exec of its own); the exec
            # timed here is what copy and shipped seeds still pay for it.
            if label not in ("half-made", "record"):
                total += value
            print(f"  {label:<10} {value:8.2f} ms")
        print(f"added to a create: {total:.1f} ms = {100 * total / median_ms(creates):.1f}% of its median")
    finally:
        for name in names:
            facts = provider.find(name)
            if facts is not None:
                _box.destroy_box(provider, facts, delete_branch=True)


if __name__ == "__main__":
    main()
