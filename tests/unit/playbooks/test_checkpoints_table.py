"""The table checkpoints.yml prints (playbooks/templates/checkpoints.txt.j2), rendered by Ansible's templating
in-process from prepared rows as agentbox_checkpoint_info returns them: oldest first, aligned, a box's own checkpoint
that is not kept marked and how to keep it said, broken and stale ones flagged."""

from __future__ import annotations

from pathlib import Path

from tests.unit.support.templating import render as template

REPO = Path(__file__).resolve().parents[3]
TEMPLATE = REPO / "playbooks" / "templates" / "checkpoints.txt.j2"

ROWS = [
    {"name": "warm", "created": "2025-01-01T12:00:05Z", "size": 1187654321, "image_exists": True, "manifest": True,
     "source_box": "fix-login", "default": True, "kept": True, "broken": False, "stale": False},
    {"name": "fix-login-1", "created": "2025-01-02T08:30:00Z", "size": 1200000000, "image_exists": True,
     "manifest": True, "source_box": "fix-login", "default": False, "kept": False, "made_by": "box", "broken": False,
     "stale": True},
    {"name": "old", "created": "2024-12-01T08:30:00Z", "size": 0, "image_exists": False, "manifest": True,
     "source_box": "spike", "default": False, "kept": True, "broken": True, "stale": False},
]  # fmt: skip


def render(rows: list[dict], tmp_path: Path, args: str = "") -> list[str]:
    variables = {"checkpoints_rows": rows, "checkpoints_all": {"project": "5292fc5e2d99be21"},
                 "checkpoints_workspace": "/src/app", "checkpoints_where": "docker", "checkpoints_args": args}  # fmt: skip
    return str(template(f"{{{{ lookup('ansible.builtin.template', '{TEMPLATE}') }}}}", variables)).split("\n")


def test_checkpoints_table_oldest_first_aligned_with_kept_default_and_notes(tmp_path: Path) -> None:
    lines = render(ROWS, tmp_path)
    header = lines[0]
    assert header.split() == ["NAME", "CREATED", "(UTC)", "SIZE", "FROM", "BOX", "DEFAULT", "KEPT", "NOTES"]
    assert [line.split()[0] for line in lines[1:4]] == ["old", "warm", "fix-login-1"]  # by creation time
    for line in lines[1:4]:  # every column starts under its header
        assert line[header.index("FROM BOX") - 1] == " " and line[header.index("KEPT") - 1] == " "
    old, warm, boxs = (line.split() for line in lines[1:4])
    assert warm[:3] == ["warm", "2025-01-01", "12:00"] and warm[5:9] == ["fix-login", "yes", "yes", "-"]
    assert boxs[6:8] == ["no", "no"] and "stale: the box image was rebuilt since; taken by the box itself" in lines[3]
    assert old[3] == "-" and "broken: its image is gone, remove it" in lines[1]  # no image: no size
    assert lines[4] == "3 checkpoints of /src/app (project 5292fc5e2d99be21, docker)"
    assert lines[5].startswith("kept no: a checkpoint the box took itself goes when the box is destroyed (unless it")
    assert lines[6] == "remove one: ansible-playbook playbooks/checkpoints.yml -e checkpoint=NAME -e state=absent [--check]"


def test_checkpoints_table_names_the_workspace_in_its_commands_and_says_how_to_take_one(tmp_path: Path) -> None:
    kept_only = [row for row in ROWS if row["kept"]]
    lines = render(kept_only, tmp_path, args=" -e workspace=/src/app")
    assert not any(line.startswith("kept no:") for line in lines)
    assert lines[-1] == ("remove one: ansible-playbook playbooks/checkpoints.yml -e checkpoint=NAME -e state=absent"
                         " -e workspace=/src/app [--check]")  # fmt: skip
    empty = render([], tmp_path)
    assert empty[1:] == ["0 checkpoints of /src/app (project 5292fc5e2d99be21, docker)",
                         "take one: ansible-playbook playbooks/checkpoint.yml -e box=NAME"]  # fmt: skip
