"""The ranks of plugins/module_utils and plugins/plugin_utils, enforced (docs/architecture.md, "Ranks").

Every file has one rank and imports only files of a lower rank, or of its own rank without a cycle.
No file uses a private name (`_x`) of another of these files. Every import counts: at the top of a
file, inside a function (the lazy imports that dodge a cycle at import time still make one), and
every spelling (`from ._a import x`, `from . import _a`, `from ..module_utils._a import x`, the
absolute `ansible_collections...` forms).

What today's code still breaks is listed below, one entry per edge with its reason. The lists only
shrink: a new violation fails, and so does an entry that no longer occurs (delete it).
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PLUGINS = REPO / "plugins"
DIRS = ("module_utils", "plugin_utils")
PACKAGE = "ansible_collections.agentbox.box.plugins"
MAX_FOLDER = 15  # files in one folder of module_utils
# Folders whose files only the providers/ folder itself and the task layer import.
PROVIDER_PACKAGES = ("module_utils/providers/docker", "module_utils/providers/daytona", "module_utils/providers/boxd")
TASK_LAYER = ("module_utils/tasks",)

PURE, HOST, INTERFACE, TRANSPORT, PROVIDER, REGISTRY, WORKFLOW, GLUE = range(8)
RANK_NAMES = ("pure", "host", "interface", "transport", "provider", "registry", "workflow", "glue")

# Folder (under plugins/) -> file stem -> rank. Stems are unique across every folder (checked below).
# Ranks: 0 pure values and checks; 1 host utilities (git, tar streams, ~/.agentbox); 2 the provider
# interface; 3 transports (Engine API, SSH, cloud SDKs, the relay's channels); 4 providers and what only
# they use; 5 the registry; 6 workflows written against the interface; 7 Ansible glue and command lines.
RANKS: dict[str, dict[str, int]] = {
    "module_utils/core": {
        "_box_data": PURE,
        "_box_tmpfs": PURE,
        "_errors": PURE,
        "_naming": PURE,
        "_secret_files": PURE,
        "_shell_line": PURE,
        "_sizes": PURE,
        "_host_files": HOST,
        "_journal": HOST,
        "_preflight": HOST,
        "_safe_extract": HOST,
        "_tarstream": HOST,
        "_boot": INTERFACE,
        "_provider": INTERFACE,
    },
    "module_utils/ssh": {
        "_ssh": TRANSPORT,
        "_ssh_dial": TRANSPORT,
        "_ssh_forward": TRANSPORT,
        "_ssh_proxy": TRANSPORT,
    },
    "module_utils/git": {
        "_git": HOST,
        "_git_view": HOST,
        "_carry_env": WORKFLOW,
        "_export": WORKFLOW,
        "_gitlayer": WORKFLOW,
        "_seed": WORKFLOW,
        "_ship": WORKFLOW,
    },
    "module_utils/checkpoint": {
        "_restore_program": PURE,
        "_checkpoint_records": INTERFACE,
        "_checkpoint": WORKFLOW,
        "_restore": WORKFLOW,
    },
    "module_utils/access": {
        "_editor_volumes": PURE,
        "_port_relay": PURE,
        "_access": WORKFLOW,
        "_forwards": WORKFLOW,
        "_screen": WORKFLOW,
    },
    "module_utils/relay": {
        "_relay_protocol": PURE,
        "_relay_channel": HOST,
        "_relay_policy": HOST,
        "_relay_state": HOST,
        "_relay_poll": TRANSPORT,
        "_relay_tunnel": TRANSPORT,
        "_relay_idle": WORKFLOW,
        "_relay_ops": WORKFLOW,
        "_relay_files": WORKFLOW,
        "_relay_server": WORKFLOW,
    },
    "module_utils/egress": {
        "_egress_forwarder": PURE,
        "_egress_policy": PURE,
        "_egress_gateway": HOST,
        "_egress_credentials": HOST,
    },
    "module_utils/providers": {
        "_snapshot_store": PROVIDER,
        "_module": REGISTRY,
        "_registry": REGISTRY,
    },
    "module_utils/providers/docker": {
        "_box_container": HOST,
        "_box_mounts": HOST,
        "_box_engine": HOST,
        "_engine_api": TRANSPORT,
        "_engine_sdk": TRANSPORT,
        "_ckpt_env": PROVIDER,
        "_docker": PROVIDER,
        "_gitlayer_volumes": PROVIDER,
        "_engine_setup": PROVIDER,
        "_image": PROVIDER,
        "_image_flatten": PROVIDER,
        "_image_store": PROVIDER,
        "_image_transfer": PROVIDER,
        "_pool_containers": PROVIDER,
        "_claimed": PROVIDER,
    },
    "module_utils/providers/daytona": {
        "_daytona_idle": PURE,
        "_daytona_options": PURE,
        "_daytona_state": PURE,
        "_daytona_api": TRANSPORT,
        "_daytona_ssh": TRANSPORT,
        "_daytona": PROVIDER,
        "_daytona_exec": PROVIDER,
        "_daytona_sandboxes": PROVIDER,
        "_daytona_snapshots": PROVIDER,
    },
    "module_utils/providers/boxd": {
        "_boxd_state": PURE,
        "_boxd_api": TRANSPORT,
        "_boxd_pipe": TRANSPORT,
        "_boxd_token": TRANSPORT,
        "_boxd": PROVIDER,
        "_boxd_store": PROVIDER,
        "_boxd_ssh": WORKFLOW,
    },
    "module_utils/box": {
        "_box": WORKFLOW,
        "_rollback": WORKFLOW,
        "_prepare": WORKFLOW,
        "_pool": WORKFLOW,
        "_pool_claim": WORKFLOW,
    },
    "module_utils/agent": {
        "_agent_record": HOST,
        "_agent": WORKFLOW,
    },
    "module_utils/idle": {
        "_idle": WORKFLOW,
    },
    "module_utils/project": {
        "_project_plan": PURE,
        "_project_scan": HOST,
    },
    "module_utils/tasks": {
        "_doctor": WORKFLOW,
        "_agent_task": GLUE,
        "_best_of": GLUE,
        "_best_of_report": PURE,
        "_box_task": GLUE,
        "_init_task": GLUE,
        "_relay_main": GLUE,
        "_wake": GLUE,
    },
    "plugin_utils": {
        "_bytecode": HOST,
        "_filetar": HOST,
        "_local_action": GLUE,
        "_providers": GLUE,
    },
}
RANK_OF: dict[str, int] = {stem: rank for table in RANKS.values() for stem, rank in table.items()}

# (importer, imported): an import of a higher rank that exists today, and why.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}

# Strongly connected components among files of one rank that exist today (sorted tuples).
KNOWN_CYCLES: dict[tuple[str, ...], str] = {}

# (user, owner, name): a private name of another file used today.
KNOWN_PRIVATE: dict[tuple[str, str, str], str] = {}


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    line: int
    lazy: bool


@dataclass(frozen=True)
class PrivateUse:
    src: str
    dst: str
    name: str
    line: int


def _target(package: str, node: ast.ImportFrom) -> str | None:
    """The dotted module (relative to plugins/) an ImportFrom names, or None when it is outside."""
    if node.level:
        parts = package.split(".")
        if node.level - 1 > len(parts):
            return None
        base = parts[: len(parts) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))
    module = node.module or ""
    if module.startswith(PACKAGE + "."):
        return module[len(PACKAGE) + 1 :]
    return None


def scan(source: str, src: str, package: str, known: dict[str, str]) -> tuple[list[Edge], list[PrivateUse]]:
    """Every import of one of `known` (dotted name relative to plugins/ -> stem) in `source` (file `src`
    in the dotted package `package`), and every private name of another known file it uses."""
    tree = ast.parse(source)
    edges: list[Edge] = []
    private: list[PrivateUse] = []
    aliases: dict[str, str] = {}  # local name bound to one of our modules -> its stem

    def visit(node: ast.AST, lazy: bool) -> None:
        if isinstance(node, ast.ImportFrom):
            target = _target(package, node)
            if target is not None:
                owner = known.get(target)
                for alias in node.names:
                    sub = known.get(f"{target}.{alias.name}")
                    if sub is not None:  # `from . import _a`: the name is a module
                        edges.append(Edge(src, sub, node.lineno, lazy))
                        aliases[alias.asname or alias.name] = sub
                    elif owner is not None and _is_private(alias.name):
                        private.append(PrivateUse(src, owner, alias.name, node.lineno))
                if owner is not None:
                    edges.append(Edge(src, owner, node.lineno, lazy))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PACKAGE + "."):
                    owner = known.get(alias.name[len(PACKAGE) + 1 :])
                    if owner is not None:
                        edges.append(Edge(src, owner, node.lineno, lazy))
                        if alias.asname:
                            aliases[alias.asname] = owner
        inner = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, False)
    stems = set(known.values())
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and _is_private(node.attr)
            and node.attr not in stems
        ):
            private.append(PrivateUse(src, aliases[node.value.id], node.attr, node.lineno))
    return [edge for edge in edges if edge.dst != src], [use for use in private if use.dst != src]


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def files() -> dict[str, Path]:
    """Stem -> path of every util file, in module_utils' folders and plugin_utils."""
    found: dict[str, Path] = {}
    for directory in DIRS:
        for path in sorted((PLUGINS / directory).rglob("*.py")):
            if path.stem == "__init__" or "__pycache__" in path.parts:
                continue
            assert path.stem not in found, f"{path.stem} is in {found[path.stem].parent} and {path.parent}"
            found[path.stem] = path
    return found


def folder_of(path: Path) -> str:
    return path.parent.relative_to(PLUGINS).as_posix()


@functools.cache
def graph() -> tuple[list[Edge], list[PrivateUse]]:
    paths = files()
    known = {f"{folder_of(path).replace('/', '.')}.{stem}": stem for stem, path in paths.items()}
    edges: list[Edge] = []
    private: list[PrivateUse] = []
    for stem, path in paths.items():
        file_edges, file_private = scan(path.read_text(), stem, folder_of(path).replace("/", "."), known)
        edges += file_edges
        private += file_private
    return edges, private


def upward(edges: list[Edge]) -> dict[tuple[str, str], list[Edge]]:
    found: dict[tuple[str, str], list[Edge]] = {}
    for edge in edges:
        if edge.src in RANK_OF and edge.dst in RANK_OF and RANK_OF[edge.dst] > RANK_OF[edge.src]:
            found.setdefault((edge.src, edge.dst), []).append(edge)
    return found


def components(nodes: set[str], pairs: set[tuple[str, str]]) -> list[tuple[str, ...]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
    successors: dict[str, list[str]] = {node: [] for node in nodes}
    for src, dst in sorted(pairs):
        successors[src].append(dst)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in successors[node]:
            if succ not in index:
                connect(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            members = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                members.append(member)
                if member == node:
                    break
            if len(members) > 1:
                found.append(tuple(sorted(members)))

    for node in sorted(nodes):
        if node not in index:
            connect(node)
    return sorted(found)


def same_rank_cycles(edges: list[Edge]) -> list[tuple[str, ...]]:
    pairs = {
        (e.src, e.dst) for e in edges if e.src in RANK_OF and e.dst in RANK_OF and RANK_OF[e.src] == RANK_OF[e.dst]
    }
    return components(set(RANK_OF), pairs)


def _where(edges: list[Edge]) -> str:
    return ", ".join(f"line {e.line}{' (in a function)' if e.lazy else ''}" for e in edges)


# --- the rules, on the code as it is --------------------------------------------------------------


def test_every_file_has_a_rank_in_its_folder() -> None:
    paths = files()
    unranked = sorted(set(paths) - set(RANK_OF))
    gone = sorted(set(RANK_OF) - set(paths))
    assert not unranked, f"give these files a rank in RANKS, under their folder: {unranked}"
    assert not gone, f"these files are gone, remove them from RANKS: {gone}"
    moved = sorted(
        f"{stem}: RANKS says {folder}, the file is in {folder_of(paths[stem])}"
        for folder, table in RANKS.items()
        for stem in table
        if folder_of(paths[stem]) != folder
    )
    assert not moved, "files in another folder than RANKS says:\n" + "\n".join(moved)
    assert len(RANK_OF) == sum(len(table) for table in RANKS.values()), "a stem is listed under two folders"


def test_module_utils_is_folders_only() -> None:
    """Nothing at the top of module_utils; every folder a package (AnsiballZ and ansible-test need the
    __init__.py); no folder over MAX_FOLDER files."""
    top = sorted(path.name for path in (PLUGINS / "module_utils").glob("*.py"))
    assert top == [], f"files at the top of module_utils (give each a folder): {top}"
    for folder in sorted(RANKS):
        if folder.startswith("module_utils/"):
            assert (PLUGINS / folder / "__init__.py").is_file(), f"{folder} needs an __init__.py"
    sizes = {folder: len(table) for folder, table in RANKS.items() if folder.startswith("module_utils/")}
    over = {folder: size for folder, size in sizes.items() if size > MAX_FOLDER}
    assert not over, f"folders over {MAX_FOLDER} files (split them): {over}"


def provider_bypasses() -> dict[tuple[str, str], list[Edge]]:
    """Imports of a provider's own folder from outside providers/ and the task layer."""
    folder = {stem: folder_of(path) for stem, path in files().items()}
    found: dict[tuple[str, str], list[Edge]] = {}
    for edge in graph()[0]:
        target, source = folder[edge.dst], folder[edge.src]
        if target.startswith(PROVIDER_PACKAGES) and not source.startswith(("module_utils/providers", *TASK_LAYER)):
            found.setdefault((edge.src, edge.dst), []).append(edge)
    return found


def test_providers_are_reached_through_the_interface_and_the_registry() -> None:
    bypasses = provider_bypasses()
    assert not bypasses, "imports of a provider's folder from outside providers/ and tasks/:\n" + "\n".join(
        f"  {src} imports {dst}: {_where(found)}" for (src, dst), found in sorted(bypasses.items())
    )


def architecture_table() -> dict[str, tuple[str, int]]:
    """docs/architecture.md's rank table: stem -> (folder, rank)."""
    text = (REPO / "docs" / "architecture.md").read_text()
    rows: dict[str, tuple[str, int]] = {}
    for match in re.finditer(r"^\| (\d) \| `([\w/]+)/(_\w+)` \|", text, re.MULTILINE):
        rank, folder, stem = int(match.group(1)), match.group(2), match.group(3)
        assert stem not in rows, f"docs/architecture.md lists {stem} twice"
        rows[stem] = (folder, rank)
    return rows


def test_architecture_doc_lists_every_file_with_its_folder_and_rank() -> None:
    documented = architecture_table()
    actual = {stem: (folder, rank) for folder, table in RANKS.items() for stem, rank in table.items()}
    missing = sorted(set(actual) - set(documented))
    extra = sorted(set(documented) - set(actual))
    wrong = sorted(
        f"{stem}: the doc says {documented[stem]}, the code {actual[stem]}"
        for stem in set(actual) & set(documented)
        if documented[stem] != actual[stem]
    )
    assert not missing, f"add to docs/architecture.md's rank table: {missing}"
    assert not extra, f"docs/architecture.md lists files that are gone: {extra}"
    assert not wrong, "docs/architecture.md's rank table differs from RANKS:\n" + "\n".join(wrong)


def test_no_import_of_a_higher_rank() -> None:
    edges = graph()[0]
    new = {pair: found for pair, found in upward(edges).items() if pair not in KNOWN_UPWARD}
    assert not new, "imports of a higher rank:\n" + "\n".join(
        f"  {src} ({RANK_NAMES[RANK_OF[src]]}) imports {dst} ({RANK_NAMES[RANK_OF[dst]]}): {_where(found)}"
        for (src, dst), found in sorted(new.items())
    )


def test_no_cycle_within_a_rank() -> None:
    edges = graph()[0]
    new = [cycle for cycle in same_rank_cycles(edges) if cycle not in KNOWN_CYCLES]
    assert not new, f"import cycles among files of one rank: {new}"


def test_no_private_name_of_another_file() -> None:
    private = graph()[1]
    new = sorted({(u.src, u.dst, u.name) for u in private} - set(KNOWN_PRIVATE))
    assert not new, "private names used across files (make them public, or move the code):\n" + "\n".join(
        f"  {src} uses {dst}.{name}" for src, dst, name in new
    )


def test_known_lists_have_no_stale_entries() -> None:
    """An entry that no longer occurs is removed, so each list only shrinks."""
    edges, private = graph()
    found_upward = upward(edges)
    stale_upward = sorted(pair for pair in KNOWN_UPWARD if pair not in found_upward)
    found_cycles = same_rank_cycles(edges)
    stale_cycles = sorted(cycle for cycle in KNOWN_CYCLES if cycle not in found_cycles)
    found_private = {(u.src, u.dst, u.name) for u in private}
    stale_private = sorted(entry for entry in KNOWN_PRIVATE if entry not in found_private)
    assert not stale_upward, f"remove from KNOWN_UPWARD (no longer imported upward): {stale_upward}"
    assert not stale_cycles, f"remove or update in KNOWN_CYCLES (that cycle is gone or changed): {stale_cycles}"
    assert not stale_private, f"remove from KNOWN_PRIVATE (no longer used): {stale_private}"


def test_reasons_are_given() -> None:
    for table in (KNOWN_UPWARD, KNOWN_CYCLES, KNOWN_PRIVATE):
        for entry, reason in table.items():
            assert reason.strip(), f"{entry} needs a reason"


# --- the checker itself, on small synthetic sources -----------------------------------------------

SYNTHETIC = """
from __future__ import annotations
import os
from ._low import helper, _secret
from . import _peer as peer
from ..module_utils._other import thing
import ansible_collections.agentbox.box.plugins.module_utils._abs as absmod
from ansible_collections.agentbox.box.plugins.module_utils import _abs2


def later():
    from ._high import Thing
    from . import _deep
    return _deep._hidden, peer.public, absmod._inner, Thing


class Holder:
    def method(self):
        import ansible_collections.agentbox.box.plugins.module_utils._high2 as h2
        return h2
"""
SYNTHETIC_KNOWN = {
    f"module_utils.{stem}": stem
    for stem in ("_me", "_low", "_peer", "_other", "_abs", "_abs2", "_high", "_deep", "_high2")
}


def test_checker_sees_every_spelling_and_lazy_imports() -> None:
    edges, private = scan(SYNTHETIC, "_me", "module_utils", SYNTHETIC_KNOWN)
    seen = {(e.dst, e.lazy) for e in edges}
    assert seen == {
        ("_low", False),
        ("_peer", False),
        ("_other", False),
        ("_abs", False),
        ("_abs2", False),
        ("_high", True),
        ("_deep", True),
        ("_high2", True),
    }
    assert {(u.dst, u.name) for u in private} == {("_low", "_secret"), ("_deep", "_hidden"), ("_abs", "_inner")}


def test_checker_ignores_imports_from_outside() -> None:
    source = "import os\nfrom ansible.module_utils.basic import AnsibleModule\nfrom ._unknown import _x\n"
    assert scan(source, "_me", "module_utils", {"module_utils._me": "_me"}) == ([], [])


def test_checker_finds_cycles_and_upward_edges() -> None:
    pairs = {("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "e"), ("e", "d"), ("f", "a")}
    assert components({"a", "b", "c", "d", "e", "f"}, pairs) == [("a", "b", "c"), ("d", "e")]
    source = "def f():\n    from ...box._box import boot_box\n"
    edges = scan(source, "_docker", "module_utils.providers.docker", {"module_utils.box._box": "_box"})[0]
    assert list(upward(edges)) == [("_docker", "_box")]
    assert edges[0].lazy
