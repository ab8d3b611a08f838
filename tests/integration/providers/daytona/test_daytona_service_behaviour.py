"""The daytona provider against the emulator behaving as the real Daytona service does (issue 19).

Each test drives the provider (and, where it says so, the real SDK) the way the live service would be
driven; the emulator's habits that make the difference are on by default (the toolbox runs as the image's
USER) or switched on here through its run-time settings, with the real service's own behaviour as the model
(daytonaio/daytona v0.190, SDK 0.226.1). Boxes are real containers from agentbox/box:latest.
Checkpoint snapshots and rate limits are in test_daytona_service_snapshots_and_throttling.py.
"""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
import textwrap
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import pytest

from tests.daytona_emulator import running_emulator
from tests.daytona_emulator.config import DESIRED_STATE_SECONDS

pytestmark = pytest.mark.integration

IMAGE = "agentbox/box:latest"
REPO = Path(__file__).resolve().parents[4]
VENV_BIN = REPO / ".venv" / "bin"


class Emu:
    def __init__(self, api_url: str, api_key: str, admin) -> None:
        self.api_url, self.api_key, self.admin = api_url, api_key, admin

    def provider(self, **options):
        from ansible_collections.agentbox.box.plugins.module_utils.providers.daytona._daytona import DaytonaProvider

        return DaytonaProvider(api_key=self.api_key, api_url=self.api_url, **options)

    def sdk(self):
        from daytona import Daytona, DaytonaConfig

        return Daytona(DaytonaConfig(api_key=self.api_key, api_url=self.api_url))


def spec(name: str, box_id: str | None = None, image: str = IMAGE, project: str = "c" * 16):
    from ansible_collections.agentbox.box.plugins.module_utils.core import _naming
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import BoxSpec

    box_id = box_id or uuid.uuid4().hex[:8]
    labels = _naming.box_labels(box=name, box_id=box_id, project=project, workspace="/nowhere", branch="",
                                image_fingerprint="", provider="daytona", engine="test")  # fmt: skip
    return BoxSpec(name=name, box_id=box_id, project=project, workspace="/nowhere", image=image, labels=labels)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def serving_emulator() -> Iterator[Emu]:
    """The emulator of this module and of test_daytona_service_snapshots_and_throttling.py (one a module)."""
    if not docker.from_env().images.list(name=IMAGE):
        pytest.fail(f"{IMAGE} is missing: build it first (ansible-playbook playbooks/build_image.yml)")
    with running_emulator(image=IMAGE) as (api_url, api_key, admin):
        yield Emu(api_url, api_key, admin)


@pytest.fixture(scope="module")
def emu() -> Iterator[Emu]:
    yield from serving_emulator()


@pytest.fixture(autouse=True)
def _clean_settings(emu: Emu) -> Iterator[None]:
    yield
    emu.admin.clear_faults()


def test_commands_files_secrets_and_idle_probe_are_the_box_users(emu: Emu, box: str) -> None:
    """The daemon runs as the image's USER (root for the box image); the box user is still vscode.
    On the module's shared box (made with a secret); the files and the heartbeat written here go at the end."""
    from ansible_collections.agentbox.box.plugins.modules.agentbox_reap import probe

    provider = emu.provider()
    name = box
    try:
        raw = emu.sdk().get(name)
        # What the daemon itself runs as (the same on Daytona: the box image has no USER).
        assert raw.process.exec("id -un").result.strip() == "root"
        assert provider.exec(name, ["id", "-un"]).text.strip() == "vscode"
        assert provider.exec(name, ["sh", "-c", 'printf %s "$HOME"']).text == "/home/vscode"
        assert provider.exec(name, ["id", "-un"], user="root").text.strip() == "root"
        made = provider.exec(name, ["sh", "-c", "f=/workspace/.owner-check; : > $f && stat -c %U $f && rm $f"])
        assert made.check("owner").text.strip() == "vscode"
        piped = provider.exec(name, ["sh", "-c", "cat > /tmp/from-stdin; stat -c %U /tmp/from-stdin"], stdin=b"x")
        assert piped.check("stdin").text.strip() == "vscode"
        # Archives keep the owners they carry.
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            info = tarfile.TarInfo("owned.txt")
            info.size, info.uid, info.gid, info.uname, info.gname = 2, 1000, 1000, "vscode", "vscode"
            archive.addfile(info, io.BytesIO(b"ok"))
        provider.put_archive(name, "/tmp", io.BytesIO(buffer.getvalue()))
        assert provider.exec(name, ["stat", "-c", "%U", "/tmp/owned.txt"]).text.strip() == "vscode"
        # The secret is the box user's to read.
        assert provider.exec(name, ["cat", "/run/agentbox/secrets/token"]).check("secret").stdout == b"t0ken"
        # The reaper's probe reads vscode's home, where agents leave their heartbeat.
        provider.exec(name, ["sh", "-c", "mkdir -p ~/.agentbox && touch -d @1600000000 ~/.agentbox/last-activity"])
        assert probe(provider, name, 30)["heartbeat"] == "1600000000"
    finally:
        # An old heartbeat would make the shared box idle to the reaper's test (same project).
        provider.exec(name, ["rm", "-f", "/tmp/from-stdin", "/tmp/owned.txt", "/home/vscode/.agentbox/last-activity"],
                      user="root").check("putting the shared box back")  # fmt: skip


def _api(emu: Emu, method: str, path: str) -> dict:
    """A plain API call, as any other client (or Daytona's own auto-stop timer) makes it."""
    request = urllib.request.Request(f"{emu.api_url}{path}", data=b"" if method == "POST" else None, method=method)
    request.add_header("Authorization", f"Bearer {emu.api_key}")
    with urllib.request.urlopen(request, timeout=30) as response:
        body = response.read()
    return json.loads(body) if body else {}


def _settled(emu: Emu, sandbox_id: str, timeout: float = 120) -> dict:
    """The sandbox once its state is its desired state (waited on with a deadline)."""
    deadline = time.monotonic() + timeout
    while True:
        sandbox = _api(emu, "GET", f"/sandbox/{sandbox_id}")
        if sandbox["state"] == sandbox.get("desiredState") and not sandbox["state"].endswith("ing"):
            return sandbox
        assert time.monotonic() < deadline, f"sandbox {sandbox_id} did not settle: {sandbox['state']}"
        time.sleep(0.2)  # polling the state, not synchronising on time


@pytest.fixture
def desired_state_lag(emu: Emu) -> Iterator[None]:
    """Lifecycle calls only set the desired state; the state follows 2 s later (creates sit in `unknown`)."""
    emu.admin.set_config(desired_state_seconds=2)
    try:
        yield
    finally:
        emu.admin.set_config(desired_state_seconds=DESIRED_STATE_SECONDS)


def test_start_waits_out_a_stop_under_way(emu: Emu, request: pytest.FixtureRequest) -> None:
    provider = emu.provider()
    name = unique("dst")
    try:
        sandbox_id = provider.create(spec(name)).container
        request.getfixturevalue("desired_state_lag")  # from here on (the create is not what is proven)
        # A stop is under way (another client's, or Daytona's auto-stop): state still `started`, desired `stopped`.
        answer = _api(emu, "POST", f"/sandbox/{sandbox_id}/stop?force=false")
        assert (answer["state"], answer["desiredState"]) == ("started", "stopped")
        assert provider.start(name).state == "running"
        assert _settled(emu, sandbox_id)["state"] == "started"  # not stopped under the caller's feet
        assert provider.exec(name, ["true"]).rc == 0
    finally:
        provider.destroy(name)


def test_a_create_read_back_in_unknown_is_adopted(emu: Emu, desired_state_lag: None) -> None:
    """The create's answer is lost; the sandbox, read back by name, is still `unknown`: wait, then adopt."""
    provider = emu.provider()
    name = unique("unk")
    emu.admin.add_fault(method="POST", path="^/api/sandbox$", action="drop_after", times=1)
    try:
        facts = provider.create(spec(name))
        assert facts.state == "running"
        assert provider.exec(name, ["id", "-un"]).text.strip() == "vscode"
        assert sum(1 for s in emu.admin.state()["sandboxes"] if s["name"] == name) == 1
    finally:
        provider.destroy(name)


def test_get_by_name_is_cached_as_daytona_caches_it(emu: Emu, desired_state_lag: None) -> None:
    """GET /sandbox/{idOrName} is cached 10 s (v0.190's lookup cache); an insert clears nothing, so the name the
    provider looked up just before its create stays "not found" until the runner's first update. A create whose
    answer is lost then reads 404 by name for a while, and is still adopted; a delete (an update) clears the keys
    at once, so the name is free and its ghost is found by id only."""
    provider = emu.provider()
    name = unique("cch")
    emu.admin.add_fault(method="POST", path="^/api/sandbox$", action="drop_after", times=1)
    try:
        assert provider.find(name) is None  # the module's look before a create: a miss, now cached
        since = max((entry["seq"] for entry in emu.admin.requests()), default=0)
        facts = provider.create(spec(name))
        assert facts.state == "running"
        assert sum(1 for s in emu.admin.state()["sandboxes"] if s["name"] == name) == 1
        gets = [(entry["path"], entry["status"]) for entry in emu.admin.requests(since) if entry["method"] == "GET"]
        assert (f"/api/sandbox/{name}", 404) in gets  # the stale miss was really served after the POST
        answer = _api(emu, "DELETE", f"/sandbox/{facts.container}")
        assert provider.find(name) is None  # the delete's rename cleared the name's key at once
        assert _api(emu, "GET", f"/sandbox/{facts.container}")["name"] == answer["name"]
    finally:
        provider.destroy(name)


def test_a_failed_create_leaves_nothing(emu: Emu) -> None:
    """The image cannot be had (the build fails): the SDK's wait raises without a status; nothing stays."""
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import ProviderError

    provider = emu.provider()
    name = unique("bf")
    with pytest.raises(ProviderError, match="build_failed") as failed:
        provider.create(spec(name, image="registry.invalid/agentbox/never-built:1"))
    # The sandbox is gone, and the error says so rather than telling the user to destroy it.
    assert "destroy it" not in str(failed.value) and "the sandbox it made was deleted" in str(failed.value)
    assert provider.find(name) is None
    assert not [s for s in emu.sdk().list() if s.name == name]
    # When that delete fails (refused once), the error says so instead of hiding it; the sandbox is left.
    kept = unique("bfk")
    emu.admin.add_fault(method="DELETE", path="/sandbox/[^/]+$", status=403, times=1)
    try:
        with pytest.raises(ProviderError, match="build_failed") as failed:
            provider.create(spec(kept, image="registry.invalid/agentbox/never-built:1"))
        assert "deleting the sandbox it made failed too" in str(failed.value), failed.value
        assert "delete the box (state: absent)" in str(failed.value), failed.value
        assert [s for s in emu.sdk().list() if s.name == kept]
    finally:
        emu.admin.clear_faults()
        provider.destroy(kept)
    assert not [s for s in emu.sdk().list() if s.name == kept]


def test_a_recoverable_error_is_recovered(emu: Emu) -> None:
    """A sandbox the runner reports broken but recoverable (a full disk) is recovered, not given up on."""
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import ProviderError

    provider = emu.provider()
    name = unique("rec")
    try:
        sandbox_id = provider.create(spec(name)).container
        emu.admin.fail_sandbox(sandbox_id, "no space left on device", recoverable=True)
        assert provider.start(name).state == "running"
        assert provider.exec(name, ["id", "-un"]).text.strip() == "vscode"
        emu.admin.fail_sandbox(sandbox_id, "the runner is gone", recoverable=False)
        with pytest.raises(ProviderError, match="cannot recover it: destroy it"):
            provider.start(name)
    finally:
        provider.destroy(name)


def test_configuration_ignores_dotenv_files_in_the_working_directory(emu: Emu, tmp_path, monkeypatch) -> None:
    """The SDK reads ./.env for what its config leaves empty; the workspace an agent writes is no config."""
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import ProviderError
    from ansible_collections.agentbox.box.plugins.module_utils.providers.daytona import _daytona as dt

    (tmp_path / ".env").write_text(f"DAYTONA_TARGET=elsewhere\nDAYTONA_API_KEY={emu.api_key}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DAYTONA_TARGET", raising=False)
    monkeypatch.delenv("DAYTONA_API_KEY", raising=False)
    monkeypatch.setattr(dt, "_CLIENTS", {})  # clients made elsewhere in this process do not count
    with pytest.raises(ProviderError, match="no Daytona API key"):
        dt.DaytonaProvider(api_url=emu.api_url).find("anything")
    provider = emu.provider()
    name = unique("env")
    try:
        facts = provider.create(spec(name))
        assert emu.admin.sandbox_internal(facts.container)["target"] != "elsewhere"
    finally:
        provider.destroy(name)
    assert (tmp_path / ".env").exists() and tmp_path.samefile(".")  # back where it was


def test_deleted_sandboxes_linger_as_ghosts_that_are_no_boxes(emu: Emu, request: pytest.FixtureRequest) -> None:
    """Deleted elsewhere (another client, auto-delete): renamed DESTROYED_<name>_<ms>, still `started` for a
    while, desired state `destroyed`. Listings skip it, and its name is free again at once."""
    provider = emu.provider()
    name = unique("gho")
    try:
        facts = provider.create(spec(name))
        request.getfixturevalue("desired_state_lag")  # from the delete on: the ghost lingers, the new create lags
        answer = _api(emu, "DELETE", f"/sandbox/{facts.container}")
        assert answer["name"].startswith(f"DESTROYED_{name}_") and answer["desiredState"] == "destroyed"
        ghost = _api(emu, "GET", f"/sandbox/{facts.container}")
        assert ghost["state"] == "started"  # lingering
        assert name not in [box.name for box in provider.list_boxes(project="c" * 16)]
        assert provider.find(name) is None
        again = provider.create(spec(name))  # the name is free while the ghost lingers
        assert again.container != facts.container and again.state == "running"
        assert [box.container for box in provider.list_boxes(project="c" * 16) if box.name == name] == [
            again.container
        ]
    finally:
        provider.destroy(name)


def test_the_reaper_ignores_ghosts(emu: Emu, tmp_path: Path) -> None:
    """A box idle for an hour, then deleted elsewhere: while its ghost (DESTROYED_<name>_<ms>, still
    `started`, still labelled as the box) lingers, agentbox_reap (its own main) neither lists, probes nor pauses it."""
    from tests.conftest import run_module_direct

    provider = emu.provider()
    name = unique("grp")
    try:
        facts = provider.create(spec(name))
        provider.exec(name, ["sh", "-c", f"mkdir -p ~/.agentbox && touch -d @{int(time.time()) - 3600} "
                                         "~/.agentbox/last-activity"]).check("an old heartbeat")  # fmt: skip
        emu.admin.set_config(desired_state_seconds=60)  # the ghost lingers through the reap below
        assert _api(emu, "DELETE", f"/sandbox/{facts.container}")["name"].startswith(f"DESTROYED_{name}_")
        reaped = run_module_direct("agentbox_reap", {"provider": "daytona", "project": "c" * 16, "idle_timeout": 1},
                                   env={"HOME": str(tmp_path), "DAYTONA_API_URL": emu.api_url,
                                        "DAYTONA_API_KEY": emu.api_key})  # fmt: skip
        assert not reaped["failed"], reaped
        assert not [b for b in reaped["boxes"] if name in b["name"]] and reaped["paused"] == [], reaped
        ghost = _api(emu, "GET", f"/sandbox/{facts.container}")
        assert ghost["name"].startswith("DESTROYED_") and ghost["state"] == "started", ghost  # it was there
    finally:
        emu.admin.set_config(desired_state_seconds=DESIRED_STATE_SECONDS)
        provider.destroy(name)


@pytest.fixture
def small_pages(emu: Emu) -> Iterator[None]:
    """A list page holds one sandbox, so a few boxes span pages as more than 100 do on Daytona."""
    emu.admin.set_config(list_page_size=1)
    try:
        yield
    finally:
        emu.admin.set_config(list_page_size=100)


def _service_order(emu: Emu, project: str) -> list[str]:
    """The project's boxes in the service's own order (its default sort, by last activity), in one page."""
    from ansible_collections.agentbox.box.plugins.module_utils.core._naming import label

    query = urllib.parse.urlencode({"labels": json.dumps({label("project"): project}), "limit": 100})
    return [item["name"] for item in _api(emu, "GET", f"/sandbox?{query}")["items"]]


def _list_while_boxes_move(emu: Emu, listing: Callable[[], object], busy: Callable[[], None]) -> object:
    """listing() in a thread; its second page request is held until busy() has run, then let go."""
    rule = emu.admin.add_fault(method="GET", path="^/api/sandbox$", action="hold", skip=1, times=1)
    answer: dict[str, object] = {}
    worker = threading.Thread(target=lambda: answer.update(result=listing()), daemon=True)
    worker.start()
    try:
        deadline = time.monotonic() + 120
        while not next(r for r in emu.admin.faults() if r["id"] == rule["id"])["fired"]:
            assert worker.is_alive() and time.monotonic() < deadline, "the listing never asked for a second page"
            time.sleep(0.1)  # polling the rule's count, not synchronising on time
        busy()  # between the first page and the second
    finally:
        emu.admin.release_fault(rule["id"])
    worker.join(300)
    assert "result" in answer, "the listing did not finish"
    return answer["result"]


def test_boxes_moving_between_pages_mid_listing_are_listed_once(emu: Emu, small_pages: None, tmp_path) -> None:
    """Daytona pages its sandbox list by a keyset cursor over last activity; activity while the pages are
    fetched moves a box across the cursor, so a listing that follows the cursor naively misses it (or meets
    it twice). Every box is used between the first page and the next: the provider's listing and the
    inventory still show each box exactly once."""
    provider = emu.provider()
    project = uuid.uuid4().hex[:16]
    names = [unique(f"pg{n}") for n in range(3)]
    try:
        for name in names:
            provider.create(spec(name, project=project))
        deadline = time.monotonic() + 60
        while sorted(before := _service_order(emu, project)) != sorted(names):  # the list catches up
            assert time.monotonic() < deadline, f"the list never showed all three boxes: {before}"
            time.sleep(0.2)  # polling the list, not synchronising on time

        def use_every_box() -> None:  # in the service's order: the order turns round
            for name in before:
                assert provider.exec(name, ["true"]).rc == 0

        since = emu.admin.requests()[-1]["seq"]
        listed = _list_while_boxes_move(emu, lambda: emu.provider().list_boxes(project=project), use_every_box)
        assert _service_order(emu, project) == list(reversed(before))  # the boxes did move
        pages = [r for r in emu.admin.requests(since) if r["method"] == "GET" and r["path"] == "/api/sandbox"]
        assert len(pages) >= len(names)  # one box a page: the listing really spanned pages
        assert sorted(box.name for box in listed) == sorted(names)

        # The inventory, its raw listing read back from its cache: each box once there too.
        cache = tmp_path / "cache"
        inventory = tmp_path / "fleet.agentbox.yml"
        inventory.write_text(textwrap.dedent(f"""\
            plugin: agentbox.box.boxes
            local: false
            agent_state: false
            cache: true
            cache_plugin: ansible.builtin.jsonfile
            cache_connection: {cache}
            daytona:
              api_url: {emu.api_url}
            """))
        env = {"PATH": f"{VENV_BIN}:/usr/bin:/bin", "HOME": str(tmp_path), "DAYTONA_API_KEY": emu.api_key,
               "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "AGENTBOX_IDLE_INTERVAL": "0"}

        def run_inventory() -> subprocess.CompletedProcess:
            return subprocess.run([str(VENV_BIN / "ansible-inventory"), "-i", str(inventory), "--list"], cwd=REPO,
                                  env=env, capture_output=True, text=True, check=False)  # fmt: skip

        def use_every_box_again() -> None:
            for name in _service_order(emu, project):
                assert provider.exec(name, ["true"]).rc == 0

        done = _list_while_boxes_move(emu, run_inventory, use_every_box_again)
        assert done.returncode == 0, done.stderr[-3000:]
        hosts = json.loads(done.stdout)["_meta"]["hostvars"]
        assert set(names) <= set(hosts)
        (cached,) = [json.loads(path.read_text()) for path in cache.iterdir()]
        if isinstance(cached.get("__payload__"), str):  # ansible-core 2.19 wraps the value it caches
            cached = json.loads(cached["__payload__"])
        raw = [box["name"] for source in cached["sources"] for box in source["boxes"]]
        assert sorted(name for name in raw if name in names) == sorted(names)
    finally:
        for name in names:
            provider.destroy(name)


@pytest.fixture(scope="module")
def box(emu: Emu) -> Iterator[str]:
    """One box for the tests that only run commands in it (each leaves its own files under unique names, or
    removes them), with a secret for the test of who reads what."""
    provider = emu.provider()
    name = unique("box")
    made = spec(name)
    made.secrets = {"token": "t0ken"}
    provider.create(made)
    try:
        yield name
    finally:
        provider.destroy(name)


@pytest.fixture
def short_edge_cut(emu: Emu) -> Iterator[None]:
    """The edge in front of the toolbox cuts any request still waiting after 2 s."""
    emu.admin.set_config(proxy_timeout_seconds=2)
    try:
        yield
    finally:
        emu.admin.set_config(proxy_timeout_seconds=300, proxy_cut_mode="504")


def test_a_long_command_outlives_a_short_edge_cut(emu: Emu, box: str, short_edge_cut: None) -> None:
    """The waiter's slice (50 s by default) shrinks to fit the cut it meets; the command is never re-run.
    No retries allowed (retries=0), so a waiter that only asked again after a cut, with a fixed slice, fails at
    the first cut; the command lasts 12 s, six cuts long, so the shrunk slice is kept, not found anew each time."""
    provider = emu.provider(retries=0)  # default slice, nothing told about the cut
    runs = f"/tmp/runs-{uuid.uuid4().hex[:6]}"
    run = provider.exec(box, ["sh", "-c", f"echo start >> {runs}; sleep 12; echo done; echo err >&2"])
    assert (run.rc, run.stdout, run.stderr) == (0, b"done\n", b"err\n")
    emu.admin.set_config(proxy_cut_mode="drop")  # the same when the edge drops the connection instead
    run = provider.exec(box, ["sh", "-c", "sleep 6; echo again"])
    assert (run.rc, run.stdout) == (0, b"again\n")
    assert provider.exec(box, ["cat", runs]).stdout == b"start\n"


def test_output_larger_than_dev_shm(emu: Emu, box: str) -> None:
    """Daytona's /dev/shm is 64 MiB (Docker's default, as the emulator's containers); output is bigger."""
    provider = emu.provider()
    shm_kib = int(provider.exec(box, ["sh", "-c", "df -kP /dev/shm | tail -n 1"]).text.split()[1])
    size = 70 * 1000 * 1000
    assert shm_kib * 1024 < size
    run = provider.exec(box, ["sh", "-c", f"yes x | tr -d '\\n' | head -c {size}; echo fine >&2"], limit=None)
    assert (run.rc, len(run.stdout), run.stderr) == (0, size, b"fine\n")
    assert run.stdout.count(b"x") == size
    # With a cap (the default for every read but the user's own commands), the waiter prints one byte past it.
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import OutputTooLarge

    with pytest.raises(OutputTooLarge, match=f"the box's output of sh is over {1 << 20} bytes"):
        provider.exec(box, ["sh", "-c", f"yes x | head -c {size}"], limit=1 << 20)


def test_a_moved_image_tag_is_built_anew(emu: Emu) -> None:
    """Daytona reuses the build of the same Dockerfile text, so `FROM repo:tag` would never see the tag move:
    the create names the content (a digest, or the image id), and the second box runs the new image."""
    from tests.daytona_emulator import TEST_IMAGE, ensure_test_image, remove_test_image

    client = docker.from_env()
    built = ensure_test_image(client)
    reference = f"localhost/agentbox-habits-{uuid.uuid4().hex[:6]}/box:v1"  # a registry reference
    repository, tag = reference.rsplit(":", 1)
    provider = emu.provider()
    first, second = unique("tg1"), unique("tg2")
    try:
        client.images.get(TEST_IMAGE).tag(repository, tag)
        provider.create(spec(first, image=reference))
        assert provider.exec(first, ["sh", "-c", "cat /etc/mark 2>/dev/null || echo none"]).text == "none\n"
        dockerfile = f"FROM {TEST_IMAGE}\nUSER root\nRUN echo two > /etc/mark\nUSER vscode\n"
        client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=reference, rm=True, pull=False)
        provider.create(spec(second, image=reference))
        assert provider.exec(second, ["cat", "/etc/mark"]).text == "two\n"
    finally:
        provider.destroy(first)
        provider.destroy(second)
        remove_test_image(client, reference)
        if built:
            remove_test_image(client)


def test_network_rules_disk_and_refusals_before_anything_is_made(emu: Emu) -> None:
    """AGENTBOX_DAYTONA_NETWORK (block_all, or an IPv4 allow list) and AGENTBOX_DAYTONA_DISK reach the create;
    a bad list, or a disk for a snapshot box (its disk is the snapshot's), fails before anything is made."""
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import ProviderError
    from tests.daytona_emulator import TEST_IMAGE, ensure_test_image, remove_test_image

    with pytest.raises(ProviderError, match="needs a CIDR prefix"):
        emu.provider(network="10.0.0.0")
    with pytest.raises(ProviderError, match="not an IPv4 network"):
        emu.provider(network="example.com/8")
    sealed, allowed, big = unique("blk"), unique("alw"), unique("dsk")
    with pytest.raises(ProviderError, match="cannot apply"):
        emu.provider(disk=20).create(spec(big))
    assert emu.provider().find(big) is None
    client = docker.from_env()
    built = ensure_test_image(client)
    reference = f"localhost/agentbox-habits-{uuid.uuid4().hex[:6]}/disk:v1"
    client.images.get(TEST_IMAGE).tag(*reference.rsplit(":", 1))
    try:
        emu.provider(network="block_all").create(spec(sealed))
        emu.provider(network="10.0.0.0/8, 192.168.1.0/24").create(spec(allowed))
        emu.provider(disk=20).create(spec(big, image=reference))
        sdk = emu.sdk()
        assert sdk.get(sealed).network_block_all is True
        assert sdk.get(allowed).network_allow_list == "10.0.0.0/8,192.168.1.0/24"
        assert sdk.get(big).disk == 20
        assert emu.provider().exec(sealed, ["id", "-un"]).text == "vscode\n"  # a sealed box still runs commands
        # block_all blocks: the sealed box has loopback only and no route, and a connection out fails at once
        # with ENETUNREACH. Tried only once the route table is seen empty, so no packet ever leaves; the box
        # with an allow list, read the same way (reading sends nothing), has its interface and default route.
        links = "ls /sys/class/net | tr '\\n' ' '; echo; awk 'NR > 1 {print $1, $2}' /proc/net/route"
        assert emu.provider().exec(sealed, ["sh", "-c", links]).text == "lo \n"
        opened = emu.provider().exec(allowed, ["sh", "-c", links]).text.splitlines()
        assert opened[0] != "lo " and any(line.split()[1:] == ["00000000"] for line in opened[1:]), opened
        attempt = ("import errno, socket, time\nstarted = time.monotonic()\ns = socket.socket()\ns.settimeout(5)\n"
                   "try:\n    s.connect(('10.255.255.1', 9))\n    print('connected')\nexcept OSError as exc:\n"
                   "    print(errno.errorcode.get(exc.errno, exc), round(time.monotonic() - started, 3))\n")  # fmt: skip
        answer = emu.provider().exec(sealed, ["python3", "-c", attempt]).text.split()
        assert answer[0] == "ENETUNREACH" and float(answer[1]) < 1.0, answer
    finally:
        for name in (sealed, allowed, big):
            emu.provider().destroy(name)
        client.images.remove(reference, force=True)
        if built:
            remove_test_image(client)


def test_preview_urls_of_any_port_and_ssh_access(emu: Emu, box: str) -> None:
    provider = emu.provider()
    provider.exec(box, ["sh", "-c", "mkdir -p /tmp/www && echo served > /tmp/www/index.html && "
                                    "(nohup python3 -m http.server 8123 --directory /tmp/www >/dev/null 2>&1 &)"])  # fmt: skip
    url = provider.preview_url(box, 8123, expires_in=120)
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                assert response.read() == b"served\n"
            break
        except urllib.error.HTTPError:
            assert time.monotonic() < deadline, "the server in the box never answered"
            time.sleep(0.5)  # waiting for the server to listen, with a deadline
    access = provider.ssh_access(box, minutes=5)
    assert access["token"] and access["token"] in access["command"]
    assert emu.sdk().get(box).validate_ssh_access(access["token"]).valid


def test_a_linux_vm_box_pauses_keeping_its_processes(emu: Emu) -> None:
    """linux-vm sandboxes pause keeping memory (Daytona's pause, not stop + archive): the agent lives on."""
    from daytona import CreateSnapshotParams, SandboxClass

    sdk = emu.sdk()
    snapshot = f"agentbox-vm-{uuid.uuid4().hex[:6]}"
    sdk.snapshot.create(CreateSnapshotParams(name=snapshot, image=IMAGE, sandbox_class=SandboxClass.LINUX_VM))
    provider = emu.provider()
    name = unique("vm")
    try:
        provider.create(spec(name, image=snapshot))
        agent = provider.exec(name, ["sh", "-c", "nohup sleep 1000 >/dev/null 2>&1 & echo $!"]).text.strip()
        assert provider.pause(name).state == "paused"
        assert sdk.get(name).state == "paused"
        assert provider.resume(name).state == "running"
        assert provider.exec(name, ["kill", "-0", agent]).rc == 0  # the same process, not a restarted box
    finally:
        provider.destroy(name)
        sdk.snapshot.delete(sdk.snapshot.get(snapshot))
