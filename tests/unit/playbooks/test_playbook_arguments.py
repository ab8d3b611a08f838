"""The lifecycle playbooks check their extra vars in their first task (an ansible.builtin.assert) and say what
to pass. Each missing or bad value is evaluated here by Ansible's own templating, in-process: the playbook's
conditions and message as written, with the play's vars and the extra vars as `-e` gives them (strings). The
integration layer (tests/integration/playbooks/test_playbook_inputs.py) runs a bad value of two playbooks to
prove the play stops at that task with nothing else run; that every playbook's check is placed so that it stops
its play the same way is read here from the play's shape."""

from __future__ import annotations

from typing import Any

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar

from tests.conftest import REPO

# `-i localhost,`: the inventory the playbooks are run with here, as the groups variable sees it.
GROUPS = {"all": ["localhost"], "ungrouped": ["localhost"]}


def check(playbook: str, extra: dict[str, str]) -> str | None:
    """The first task's fail_msg when its assert fails for these extra vars, None when it passes."""
    loader = DataLoader()
    play = loader.load_from_file(str(REPO / "playbooks" / playbook), trusted_as_template=True)[0]
    first = play["tasks"][0]
    assert "ansible.builtin.assert" in first, f"{playbook}: the first task is not the check: {first.get('name')}"
    args: dict[str, Any] = first["ansible.builtin.assert"]
    templar = Templar(loader=loader, variables={**play.get("vars", {}), "groups": GROUPS, **extra})
    conditions = args["that"] if isinstance(args["that"], list) else [args["that"]]
    if all(templar.evaluate_conditional(condition) for condition in conditions):
        return None
    return " ".join(str(templar.template(args["fail_msg"])).split())


REFUSED = [
    ("box_state.yml", {}, "use -e box=NAME -e state=started|paused|stopped"),
    ("box_state.yml", {"box": "some-box"}, "use -e box=NAME -e state=started|paused|stopped"),
    ("box_state.yml", {"box": "some-box", "state": "sleeping"}, "use -e box=NAME -e state=started|paused|stopped"),
    ("box_state.yml", {"state": "paused"}, "use -e box=NAME -e state=started|paused|stopped"),
    ("checkpoint.yml", {}, "pass the box to checkpoint: -e box=NAME"),
    ("checkpoint.yml", {"box": ""}, "pass the box to checkpoint: -e box=NAME"),
    ("checkpoint.yml", {"box": "b1", "keep": "true", "checkpoint": "warm"}, "pass the box to checkpoint: -e box=NAME"),
    ("checkpoint.yml", {"keep": "true"}, "or, to keep a checkpoint a box took, -e checkpoint=NAME -e keep=true"),
    ("checkpoints.yml", {"state": "absent"}, "to remove a checkpoint pass its name: -e checkpoint=NAME -e state=absent"),
    ("checkpoints.yml", {"checkpoint": "warm", "state": "gone"}, "to remove a checkpoint pass its name"),
    ("destroy_box.yml", {}, "say which box: -e box=NAME"),
    ("destroy_box.yml", {"box": ""}, "say which box: -e box=NAME"),
    ("switch_box.yml", {}, "say which box to switch to: -e box=NAME"),
    ("switch_box.yml", {"box": ""}, "say which box to switch to: -e box=NAME"),
    ("fleet_create.yml", {"count": "2"}, "No engines in inventory group 'engines'"),
    ("fleet_create.yml", {"engines_group": "mine"}, "No engines in inventory group 'mine'"),
    ("fleet_create.yml", {"provider": "daytona"}, "provider must be docker (every box on the local engine)"),
    ("forward.yml", {}, "use -e box=NAME [-e port=PORT] [-e local_port=PORT]"),
    ("forward.yml", {"box": "b1", "port": "0"}, "use -e box=NAME [-e port=PORT]"),
    ("forward.yml", {"box": "b1", "state": "gone"}, "[-e state=present|absent]"),
    ("shell.yml", {"box": "b1", "name": "a;b"}, "use -e box=BOX [-e name=NAME (letters, digits, _ . -)]"),
    ("shell.yml", {"name": "build"}, "use -e box=BOX [-e name=NAME (letters, digits, _ . -)]"),
    ("shell.yml", {"box": "b1", "state": "gone"}, "[-e state=present|absent|list]"),
]


@pytest.mark.parametrize(("playbook", "extra", "message"), REFUSED,
                         ids=[f"{p}:{' '.join(f'{k}={v}' for k, v in e.items()) or 'none'}" for p, e, _m in REFUSED])
def test_missing_or_bad_arguments_fail_the_first_task_with_what_to_pass(playbook: str, extra: dict[str, str],
                                                                        message: str) -> None:  # fmt: skip
    said = check(playbook, extra)
    assert said is not None and message in said, said


ACCEPTED = [
    ("box_state.yml", {"box": "b1", "state": state}) for state in ("started", "paused", "stopped")
] + [
    ("checkpoint.yml", {"box": "b1"}),
    ("checkpoint.yml", {"checkpoint": "warm", "keep": "true"}),
    ("checkpoints.yml", {}),
    ("checkpoints.yml", {"state": "listed"}),
    ("checkpoints.yml", {"checkpoint": "warm", "state": "absent"}),
    ("destroy_box.yml", {"box": "b1"}),
    ("switch_box.yml", {"box": "b1"}),
    ("fleet_create.yml", {"provider": "docker", "count": "2"}),
    ("forward.yml", {"box": "b1"}),
    ("forward.yml", {"box": "b1", "port": "8765", "state": "absent"}),
    ("shell.yml", {"box": "b1", "name": "build"}),
    ("shell.yml", {"box": "b1", "state": "list"}),
]


@pytest.mark.parametrize(("playbook", "extra"), ACCEPTED,
                         ids=[f"{p}:{' '.join(f'{k}={v}' for k, v in e.items()) or 'none'}" for p, e in ACCEPTED])
def test_good_arguments_pass_the_check(playbook: str, extra: dict[str, str]) -> None:
    assert check(playbook, extra) is None


# What a play does after its first task fails is Ansible's (the host leaves the play and every later play of the
# run; ansible-playbook exits 2): tests/integration/playbooks/test_playbook_inputs.py proves it on
# checkpoint.yml and fleet_create.yml. That it holds for every playbook with a check is the play's shape, read here.
CHECKED = sorted({playbook for playbook, _extra, _message in REFUSED})
STOPPERS = ("ignore_errors", "ignore_unreachable", "max_fail_percentage", "failed_when", "when", "block", "rescue",
            "always", "any_errors_fatal", "check_mode", "delegate_to", "loop", "with_items", "until")


@pytest.mark.parametrize("playbook", CHECKED)
def test_the_check_is_the_first_thing_each_playbook_runs_and_nothing_keeps_its_failure_from_ending_the_play(
    playbook: str,
) -> None:
    plays = DataLoader().load_from_file(str(REPO / "playbooks" / playbook), trusted_as_template=True)
    first = plays[0]
    assert first["hosts"] == "localhost", playbook  # one host: its failure leaves no host in this play or the next
    assert first.get("gather_facts") is False, playbook  # no fact gathering before the check
    assert not {"pre_tasks", "roles"} & set(first), playbook  # nothing that runs before the tasks
    assert not {"ignore_errors", "ignore_unreachable", "max_fail_percentage"} & set(first), playbook
    check = first["tasks"][0]
    assert "ansible.builtin.assert" in check, playbook
    assert not set(STOPPERS) & set(check), f"{playbook}: the check has {set(STOPPERS) & set(check)}"
