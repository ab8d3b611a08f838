"""Issue 18 on the Daytona provider, through the local emulator and the real SDK: with_env,
download.yml and fetch_branch.yml on a shipped box, and the restore hint of checkpoint.yml
followed literally (it must name -e provider=daytona, or it restores on the local engine)."""

from __future__ import annotations

import os
import shlex
import subprocess
import uuid
from unittest import mock

from tests.conftest import REPO, chown_tree, git, make_repo
from tests.integration.playbooks.test_playbook_output import flat, line, restore_hint
from tests.integration.providers.daytona.test_daytona_provider import VENV_BIN, World, world  # noqa: F401  # pylint: disable=unused-import
from tests.unit.support.inprocess import run_module_inprocess


def test_files_in_and_out_and_the_restore_hint_on_daytona(world: World) -> None:  # noqa: F811
    ws = make_repo(world.root / "nc-ws", {"README.md": "r\n", ".gitignore": ".env*\n"})
    (ws / ".env").write_text("TOKEN=daytona-test\n")
    (ws / "notes.md").write_text("untracked\n")
    chown_tree(ws)
    box = f"ncd-{uuid.uuid4().hex[:6]}"
    restored = f"{box}-r"
    try:
        out = world.playbook("create_box.yml", f"workspace={ws}", f"box={box}", "with_env=true").stdout
        assert "ignored: 1 ignored files on a tmpfs, never checkpointed: .env" in flat(out), out[-3000:]
        provider = world.provider()
        assert provider.exec(box, ["cat", "/workspace/.env"]).check("cat").stdout == b"TOKEN=daytona-test\n"
        tmpfs = provider.exec(box, ["sh", "-c", 'stat -f -c %T "$(readlink -f /workspace/.env)"']).check("stat")
        assert tmpfs.text.strip() == "tmpfs"
        commit = "cd /workspace && echo fix > fix.txt && git add fix.txt && git -c user.name=A -c user.email=a@x.invalid commit -qm fix && git rev-parse HEAD"
        tip = provider.exec(box, ["sh", "-c", commit]).check("commit").text.strip()
        provider.exec(box, ["sh", "-c", "echo wip >> /workspace/README.md"]).check("edit")

        dest = world.root / "nc-export"
        done = world.playbook("download.yml", f"box={box}", f"dest={dest}")
        assert f"to: {dest}" in flat(done.stdout)
        assert (dest / "README.md").read_text() == "r\nwip\n" and (dest / "fix.txt").read_text() == "fix\n"
        assert (dest / "notes.md").read_text() == "untracked\n" and not (dest / ".env").exists()

        fetched = flat(world.playbook("fetch_branch.yml", f"box={box}").stdout)
        assert f"agentbox/{box} at {tip}" in fetched and "(updated)" in fetched
        assert git(ws, "rev-parse", f"agentbox/{box}").strip() == tip

        saved = world.playbook("checkpoint.yml", f"box={box}", "checkpoint=nchint").stdout
        hint = restore_hint(saved)
        assert "-e provider=daytona" in hint, hint
        # Followed literally (plus a box name), from the repository root.
        argv = shlex.split(hint)
        assert argv[:2] == ["ansible-playbook", "playbooks/create_box.yml"]
        argv[0] = str(VENV_BIN / "ansible-playbook")
        ran = subprocess.run([*argv, "-e", f"box={restored}"], cwd=REPO, env=world.env(), capture_output=True,
                             text=True, check=False)  # fmt: skip
        assert ran.returncode == 0, ran.stdout[-3000:]
        assert line(ran.stdout, "from") == "checkpoint nchint"
        facts = world.provider().find(restored)
        assert facts is not None and facts.provider == "daytona" and facts.checkpoint == "nchint"
        # The snapshot carried no .env: the restored box has at most the dangling link.
        assert world.provider().exec(restored, ["cat", "/workspace/.env"]).rc != 0
    finally:
        # Both boxes and the snapshot removed by the modules' own main, in this process (destroy_box.yml
        # and checkpoint removal are proven elsewhere): no Ansible start for the clean-up.
        with mock.patch.dict(os.environ, world.env(), clear=True):
            for name in (restored, box):
                run_module_inprocess("agentbox_box", {"provider": "daytona", "name": name, "state": "absent"})
            run_module_inprocess("agentbox_checkpoint", {"provider": "daytona", "workspace": str(ws), "name": "nchint",
                                                         "state": "absent"})  # fmt: skip
