"""The box image on the real engine: the role, the agentbox_image module, the debootstrap base.

Every test tags images only under its own `agentbox-test/...` repository and removes them at the
end. The role builds the real box image under a test repository once for the module (`role_build`):
when the engine already has agentbox/box of the same fingerprint, every layer is a cache hit and it
takes seconds. The debootstrap base is made in a thread while the other tests run (`debootstrap_base`).
The role runs through ansible-playbook, and so does the first build of
test_module_builds_reuses_and_rebuilds_on_change; the module's other runs start its own main
directly (conftest.py), as Ansible does on the target, without an Ansible process each.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.conftest import run_module_direct

REPO = Path(__file__).resolve().parents[3]
if str(REPO / ".collections") not in sys.path:
    sys.path.insert(0, str(REPO / ".collections"))

from ansible_collections.agentbox.box.plugins.module_utils.providers.docker import _image  # noqa: E402

pytestmark = pytest.mark.integration
ANSIBLE_PLAYBOOK = str(REPO / ".venv" / "bin" / "ansible-playbook")
BASE = "debian:bookworm"


@pytest.fixture(scope="module")
def client(docker_client: docker.DockerClient) -> docker.DockerClient:
    return docker_client


def remove_repository(client: Any, name: str) -> None:
    for image in client.images.list(name=name):
        for reference in image.tags:
            if reference.startswith(name + ":"):
                try:
                    client.images.remove(reference)
                except docker.errors.APIError:
                    pass


@pytest.fixture
def repository(client: Any) -> Iterator[str]:
    """A fresh image repository; every tag in it is removed afterwards."""
    name = f"agentbox-test/image-{secrets.token_hex(4)}"
    yield name
    remove_repository(client, name)


def run_playbook(tmp_path: Path, tasks: list[dict[str, Any]], *, check: bool = False) -> tuple[str, dict[str, Any]]:
    """Run tasks on localhost; returns (stdout, the JSON each task saved with `save`)."""
    out = tmp_path / f"out-{secrets.token_hex(3)}.json"
    play = [
        {
            "hosts": "localhost",
            "connection": "local",
            "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}"},
            "gather_facts": False,
            "tasks": [
                *tasks,
                {
                    "name": "save",
                    "ansible.builtin.copy": {"content": "{{ saved | to_json }}", "dest": str(out), "mode": "0600"},
                    "check_mode": False,
                    "changed_when": False,
                },
            ],
        }
    ]
    playbook = tmp_path / f"play-{secrets.token_hex(3)}.yml"
    playbook.write_text(json.dumps(play))
    # An explicit inventory: the checkout's ansible.cfg default is read as a list of paths.
    command = [ANSIBLE_PLAYBOOK, "-i", "localhost,", str(playbook)] + (["--check"] if check else [])
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1800, check=False)
    assert out.exists(), f"playbook failed before saving:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
    return done.stdout, json.loads(out.read_text())


def run_module(tmp_path: Path, args: dict[str, Any], *, check: bool = False, through_ansible: bool = False) -> dict[str, Any]:
    """agentbox_image's result: its own main run directly, or with through_ansible as a task of a playbook."""
    if not through_ansible:
        return run_module_direct("agentbox_image", args, check_mode=check)
    tasks = [
        {"agentbox.box.agentbox_image": args, "register": "result", "ignore_errors": True},
        {"ansible.builtin.set_fact": {"saved": "{{ result }}"}},
    ]
    return run_playbook(tmp_path, tasks, check=check)[1]


def make_context(root: Path, marker: str, *, failing: bool = False) -> Path:
    (root / "bin").mkdir(parents=True, exist_ok=True)
    script = root / "bin" / "agentbox-hello"
    script.write_text(f"#!/bin/sh\necho {marker}\n")
    script.chmod(0o755)
    steps = ["RUN echo made-by-the-test > /made", "RUN echo before-the-failure && false"] if failing else []
    (root / "Dockerfile").write_text(
        "\n".join([f"FROM {BASE}", *steps, 'COPY ["bin/agentbox-hello", "/usr/local/bin/"]', ""])
    )
    return root


def module_args(context: Path, repository: str, tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {"context": str(context), "tag": repository, "build_log": str(tmp_path / "logs" / "build.log"), **extra}


def image_id(client: Any, reference: str) -> str | None:
    try:
        return client.images.get(reference).id
    except docker.errors.ImageNotFound:
        return None


def role_task(repository: str, log: Path) -> dict[str, Any]:
    return {
        "ansible.builtin.include_role": {"name": "agentbox.box.box_image"},
        "vars": {"box_image_tag": repository, "box_image_build_log": str(log)},
    }


ROLE_SAVE = {"ansible.builtin.set_fact": {"saved": {"result": "{{ box_image_result }}", "ref": "{{ box_image_ref }}"}}}


@pytest.fixture(scope="module")
def role_build(client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The role's first run into a fresh repository (the tests only read the image it tags)."""
    tmp_path = tmp_path_factory.mktemp("role")
    repository = f"agentbox-test/image-{secrets.token_hex(4)}"
    try:
        out, saved = run_playbook(tmp_path, [role_task(repository, tmp_path / "box-image.log"), ROLE_SAVE])
        yield {"repository": repository, "out": out, "first": saved, "tmp_path": tmp_path}
    finally:
        remove_repository(client, repository)


def test_role_twice_second_run_changes_nothing(client: Any, role_build: dict[str, Any]) -> None:
    repository, first_out, first, tmp_path = (role_build[key] for key in ("repository", "out", "first", "tmp_path"))
    assert first["result"]["changed"] is True, first_out[-3000:]
    tag = first["ref"]
    assert tag == first["result"]["tag"] and tag.startswith(repository + ":")
    image = client.images.get(tag)
    assert image.labels[_image.FINGERPRINT_LABEL] == first["result"]["fingerprint"]
    assert image.labels[_image.KIND_LABEL] == "image"
    assert image.labels[_image.FINGERPRINT_LABEL].startswith(tag.rsplit(":", 1)[1])
    assert image_id(client, f"{repository}:latest") == image.id
    assert first["result"]["size"] == image.attrs["Size"] > 0

    second_out, second = run_playbook(tmp_path, [role_task(repository, tmp_path / "box-image.log"), ROLE_SAVE])
    assert second["result"]["changed"] is False
    assert second["result"]["built"] is False and second["ref"] == tag
    recap = [line for line in second_out.splitlines() if line.startswith("localhost")]
    assert recap and "changed=0" in recap[-1], second_out[-3000:]
    assert "already built" in second_out
    assert image_id(client, tag) == image.id  # the same image, not a rebuild of it


def test_role_image_has_the_user_and_programs(client: Any, role_build: dict[str, Any]) -> None:
    saved = role_build["first"]["ref"]
    # The cleanup script runs as root and keeps what it should keep.
    script = (
        "set -e; id -u vscode; id -nG vscode; sudo -u vscode sudo -n true && echo sudo-ok; "
        "stat -c '%a %U' /usr/local/bin/agentbox-checkpoint-cleanup /workspace /run/agentbox; "
        "git config --system --get-all safe.directory; "
        "mkdir -p /var/log/agentbox /home/vscode/.npm; echo keep > /var/log/agentbox/state; "
        "echo data > /var/log/some.log; echo x > /tmp/scratch; echo y > /var/tmp/.hidden; "
        "echo ls > /root/.bash_history; echo pkg > /home/vscode/.npm/cached; echo src > /workspace/main.c; "
        "agentbox-checkpoint-cleanup; "
        "echo state=$(cat /var/log/agentbox/state) log=$(stat -c %s /var/log/some.log) "
        "tmp=$(find /tmp /var/tmp -mindepth 1 | wc -l) hist=$(stat -c %s /root/.bash_history) "
        "npm=$(cat /home/vscode/.npm/cached) ws=$(cat /workspace/main.c)"
    )
    output = client.containers.run(saved, ["sh", "-c", script], remove=True).decode()
    lines = output.splitlines()
    assert lines[0] == "1000"
    assert "docker" in lines[1].split()
    assert "sudo-ok" in lines
    assert "755 root" in lines and "755 vscode" in lines
    assert "*" in lines
    assert lines[-1] == "state=keep log=0 tmp=0 hist=0 npm=pkg ws=src", output


def test_module_builds_reuses_and_rebuilds_on_change(client: Any, repository: str, tmp_path: Path) -> None:
    context = make_context(tmp_path / "ctx", "one")
    args = module_args(context, repository, tmp_path)

    built = run_module(tmp_path, args, through_ansible=True)  # the module as a playbook's task
    assert built["changed"] is True and built["built"] is True, built.get("msg")
    assert built["base_source"] == "present"  # the base is on the engine (the box image was built from it)
    assert built["tag"] == f"{repository}:{built['fingerprint'][:16]}"
    assert image_id(client, built["tag"]) == image_id(client, f"{repository}:latest") == built["image_id"]
    log_text = Path(built["log"]).read_text()
    assert "Step 1/" in log_text and "Step 1/" not in json.dumps({k: v for k, v in built.items() if k != "log"})

    again = run_module(tmp_path, args)
    assert again["changed"] is False and again["built"] is False and again["tag"] == built["tag"]

    # Someone moves :latest away: the no-op run puts it back and says so.
    client.images.get(BASE).tag(repository, "latest")
    repointed = run_module(tmp_path, args)
    assert repointed["built"] is False and repointed["latest_moved"] is True and repointed["changed"] is True
    assert image_id(client, f"{repository}:latest") == built["image_id"]

    # Any change to a copied file is a new fingerprint; check mode reports it and builds nothing.
    make_context(context, "two")
    preview = run_module(tmp_path, args, check=True)
    assert preview["changed"] is True and preview["would_build"] is True and preview["built"] is False
    assert preview["fingerprint"] != built["fingerprint"]
    assert image_id(client, preview["tag"]) is None

    rebuilt = run_module(tmp_path, args)
    assert rebuilt["changed"] is True and rebuilt["tag"] == preview["tag"]
    assert image_id(client, f"{repository}:latest") == rebuilt["image_id"] != built["image_id"]
    output = client.containers.run(rebuilt["tag"], ["agentbox-hello"], remove=True).decode().strip()
    assert output == "two"

    # Check mode on an unchanged context: nothing to do.
    unchanged = run_module(tmp_path, args, check=True)
    assert unchanged["changed"] is False and unchanged["would_build"] is False


def test_older_fingerprint_images_are_pruned_unless_a_container_uses_them(
    client: Any, repository: str, tmp_path: Path
) -> None:
    context = make_context(tmp_path / "ctx", "one")
    args = module_args(context, repository, tmp_path, keep_previous=1)
    first = run_module(tmp_path, args)
    assert first["built"] is True and first["removed"] == []
    # A box (here a stopped container) made from the first image.
    holder = client.containers.create(first["tag"], ["true"], name=f"agentbox-test-holder-{secrets.token_hex(3)}")
    try:
        make_context(context, "two")
        second = run_module(tmp_path, args)
        assert second["built"] is True and second["removed"] == []  # one previous image is kept
        make_context(context, "three")
        third = run_module(tmp_path, args)
        # The first is beyond keep_previous but a container uses it: it stays.
        assert third["built"] is True and third["removed"] == [], third["msg"]
        assert image_id(client, first["tag"]) == first["image_id"]
    finally:
        holder.remove(force=True)
    # A tag added by hand in the repository is not the module's to remove.
    client.images.get(first["tag"]).tag(repository, "pinned-by-hand")

    # Unchanged context, nothing to build: pruning still runs. Check mode only says what it would do.
    preview = run_module(tmp_path, args, check=True)
    assert preview["changed"] is True and preview["removed"] == [first["tag"]]
    assert image_id(client, first["tag"]) == first["image_id"]
    pruned = run_module(tmp_path, args)
    assert pruned["built"] is False and pruned["changed"] is True and pruned["removed"] == [first["tag"]]
    assert image_id(client, first["tag"]) is None
    assert image_id(client, f"{repository}:pinned-by-hand") == first["image_id"]
    assert image_id(client, second["tag"]) == second["image_id"]  # the one kept
    assert image_id(client, third["tag"]) == image_id(client, f"{repository}:latest") == third["image_id"]

    only_current = run_module(tmp_path, {**args, "keep_previous": 0})
    assert only_current["removed"] == [second["tag"]] and image_id(client, second["tag"]) is None
    negative = run_module(tmp_path, {**args, "keep_previous": -1})
    assert negative.get("failed") and "keep_previous must be 0 or more" in negative["msg"]


def test_build_disabled_while_missing_fails_with_advice(client: Any, repository: str, tmp_path: Path) -> None:
    context = make_context(tmp_path / "ctx", "never-built")
    result = run_module(tmp_path, module_args(context, repository, tmp_path, build=False))
    assert result.get("failed") is True
    assert "building is disabled" in result["msg"] and "box_image_build: true" in result["msg"]
    assert client.images.list(name=repository) == []


def test_failed_build_reports_the_log_tail_and_tags_nothing(client: Any, repository: str, tmp_path: Path) -> None:
    context = make_context(tmp_path / "ctx", "broken", failing=True)
    # Listings alone: the SDK's list inspects each container, and other tests' boxes come and go meanwhile.
    containers_before = {c["Id"] for c in client.api.containers(all=True)}
    result = run_module(tmp_path, module_args(context, repository, tmp_path))
    assert result.get("failed") is True
    assert "failed" in result["msg"] and "before-the-failure" in result["msg"]
    # The log's tail is in the message: the step lines come from the log, not from the error.
    assert "last lines of" in result["msg"] and "Step 2/" in result["msg"]
    assert client.images.list(name=repository) == []
    leftovers = [
        c["Id"]
        for c in client.api.containers(all=True)
        if c["Id"] not in containers_before and "before-the-failure" in c.get("Command", "")
    ]
    assert not leftovers, "the failed build left intermediate containers"
    # The layer the successful RUN made is removed with the failed build.
    log_text = (tmp_path / "logs" / "build.log").read_text()
    made = re.search(r"Step 2/\d+ : RUN echo made-by-the-test.*?\n ---> Running in \w+\n.*? ---> ([0-9a-f]+)\n", log_text, re.S)
    assert made, log_text[-2000:]
    assert image_id(client, made.group(1)) is None, "the failed build left its layer image behind"
    assert "removed the 1 layer image(s)" in log_text


def test_unbuildable_base_fails_with_advice(client: Any, repository: str, tmp_path: Path) -> None:
    context = tmp_path / "ctx"
    context.mkdir()
    base = f"agentbox-test/no-such-base-{secrets.token_hex(3)}:1"
    (context / "Dockerfile").write_text(f"FROM {base}\n")
    refused = run_module(tmp_path, module_args(context, repository, tmp_path, base=base))
    assert refused.get("failed") is True and "only Debian bases" in refused["msg"]
    no_base_build = run_module(tmp_path, module_args(context, repository, tmp_path, base=base, allow_base_build=False))
    assert no_base_build.get("failed") is True and "allow_base_build is false" in no_base_build["msg"]
    assert client.images.list(name=repository) == []


def test_bad_repository_fails_before_anything(repository: str, tmp_path: Path) -> None:
    context = make_context(tmp_path / "ctx", "x")
    result = run_module(tmp_path, module_args(context, repository + ":v1", tmp_path))
    assert result.get("failed") is True and "repository without a tag" in result["msg"]


@pytest.fixture(scope="module", autouse=True)
def debootstrap_base(request: pytest.FixtureRequest, client: Any,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any] | None]:
    """The debootstrap base, made in a thread from the module's first test on: it takes half a minute of
    downloads and unpacking, and the module's other tests run meanwhile. Its test waits for it and checks it.
    Not started when that test is not run (deselected, or not root)."""
    wanted = any(getattr(item, "module", None) is request.module and item.name == DEBOOTSTRAP_TEST
                 for item in request.session.items)  # fmt: skip
    if os.geteuid() != 0 or not wanted:
        yield None
        return
    root = tmp_path_factory.mktemp("debootstrap")
    workdir = root / "work"
    workdir.mkdir()
    repository = f"agentbox-test/image-{secrets.token_hex(4)}"

    def build() -> str:
        own_client = docker.from_env()  # a client of its own: the tests use theirs meanwhile
        log = _image.BuildLog(str(root / "base.log"))
        try:
            return _image.build_base_with_debootstrap(
                own_client, BASE, log, workdir=str(workdir), import_as=f"{repository}:base"
            )
        finally:
            log.close()
            own_client.close()

    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(build)
        try:
            yield {"future": future, "workdir": workdir, "repository": repository}
        finally:
            future.exception()  # it ends before its image is removed, whatever became of the test
            remove_repository(client, repository)


DEBOOTSTRAP_TEST = "test_debootstrap_base_imports_a_clean_debian"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: debootstrap")
def test_debootstrap_base_imports_a_clean_debian(client: Any, debootstrap_base: dict[str, Any] | None) -> None:
    assert debootstrap_base is not None
    built_id = debootstrap_base["future"].result()
    workdir, repository = debootstrap_base["workdir"], debootstrap_base["repository"]
    assert list(workdir.iterdir()) == [], "the debootstrap scratch directory was left behind"
    assert image_id(client, f"{repository}:base") == built_id
    report = client.containers.run(
        f"{repository}:base",
        ["sh", "-c", "cat /etc/apt/sources.list; ls /var/cache/apt/archives/ | grep -c '[.]deb$' || true"],
        remove=True,
    ).decode()
    assert " bookworm main" in report and " bookworm-updates main" in report
    assert report.splitlines()[-1] == "0"
    assert client.images.get(f"{repository}:base").labels.get(_image.KIND_LABEL) == "base"
