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
from dataclasses import dataclass
from pathlib import Path

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
DIRS = ("module_utils", "plugin_utils")
PACKAGE = "ansible_collections.agentbox.box.plugins"

PURE, HOST, INTERFACE, TRANSPORT, PROVIDER, REGISTRY, WORKFLOW, GLUE = range(8)
RANK_NAMES = ("pure", "host", "interface", "transport", "provider", "registry", "workflow", "glue")

# File stem -> rank. Stems are unique across both directories (checked below).
RANKS: dict[str, int] = {
    # 0 pure helpers: names, labels, states as data, checks on values, in-box layout constants, errors.
    "_errors": PURE,
    "_naming": PURE,
    "_restore_program": PURE,
    "_shell_line": PURE,
    "_daytona_state": PURE,
    "_boxd_state": PURE,
    "_relay_protocol": PURE,
    "_box_data": PURE,
    "_box_tmpfs": PURE,
    "_secret_files": PURE,
    "_editor_volumes": PURE,
    "_daytona_options": PURE,
    "_daytona_idle": PURE,
    # 1 host utilities: git, tar streams, ~/.agentbox state and locks, threads.
    "_git": HOST,
    "_host_files": HOST,
    "_box_engine": HOST,
    "_git_view": HOST,
    "_journal": HOST,
    "_tarstream": HOST,
    "_safe_extract": HOST,
    "_preflight": HOST,
    "_relay_state": HOST,
    "_relay_policy": HOST,
    "_agent_record": HOST,
    "_relay_channel": HOST,
    "_filetar": HOST,
    "_bytecode": HOST,
    "_box_container": HOST,
    # 2 the provider interface.
    "_provider": INTERFACE,
    "_checkpoint_records": INTERFACE,
    "_boot": INTERFACE,
    # 3 transports: the Engine API, SSH, the cloud SDK wrappers, the relay's channels into a box.
    "_engine_api": TRANSPORT,
    "_engine_sdk": TRANSPORT,
    "_ssh": TRANSPORT,
    "_ssh_dial": TRANSPORT,
    "_ssh_forward": TRANSPORT,
    "_ssh_proxy": TRANSPORT,
    "_boxd_pipe": TRANSPORT,
    "_boxd_api": TRANSPORT,
    "_boxd_token": TRANSPORT,
    "_daytona_ssh": TRANSPORT,
    "_daytona_api": TRANSPORT,
    "_relay_tunnel": TRANSPORT,
    "_relay_poll": TRANSPORT,
    # 4 providers and what only they use (engine images, snapshot stores).
    "_docker": PROVIDER,
    "_daytona": PROVIDER,
    "_daytona_exec": PROVIDER,
    "_daytona_snapshots": PROVIDER,
    "_daytona_sandboxes": PROVIDER,
    "_boxd": PROVIDER,
    "_boxd_store": PROVIDER,
    "_snapshot_store": PROVIDER,
    "_image": PROVIDER,
    "_image_transfer": PROVIDER,
    "_ckpt_env": PROVIDER,
    "_image_store": PROVIDER,
    "_image_flatten": PROVIDER,
    "_gitlayer_volumes": PROVIDER,
    "_engine_setup": PROVIDER,
    # 5 the registry: which providers exist, their options.
    "_registry": REGISTRY,
    "_module": REGISTRY,
    # 6 workflows, written against the interface.
    "_box": WORKFLOW,
    "_seed": WORKFLOW,
    "_ship": WORKFLOW,
    "_gitlayer": WORKFLOW,
    "_checkpoint": WORKFLOW,
    "_restore": WORKFLOW,
    "_carry_env": WORKFLOW,
    "_export": WORKFLOW,
    "_rollback": WORKFLOW,
    "_access": WORKFLOW,
    "_boxd_ssh": WORKFLOW,
    "_agent": WORKFLOW,
    "_idle": WORKFLOW,
    "_relay_ops": WORKFLOW,
    "_relay_idle": WORKFLOW,
    "_relay_server": WORKFLOW,
    "_doctor": WORKFLOW,
    # 7 Ansible glue and command-line entry points.
    "_box_task": GLUE,
    "_agent_task": GLUE,
    "_wake": GLUE,
    "_relay_main": GLUE,
    "_providers": GLUE,
    "_local_action": GLUE,
}

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
        parts = [package] if node.level == 1 else []
        if node.level > 2:
            return None
        return ".".join(parts + ([node.module] if node.module else []))
    module = node.module or ""
    if module.startswith(PACKAGE + "."):
        return module[len(PACKAGE) + 1 :]
    return None


def _stem(dotted: str, known: set[str]) -> str | None:
    """`module_utils._git` -> `_git` when it is one of ours."""
    head, stem = dotted.rpartition(".")[::2]
    return stem if head in DIRS and stem in known else None


def scan(source: str, src: str, package: str, known: set[str]) -> tuple[list[Edge], list[PrivateUse]]:
    """Every import of one of `known` in `source` (file `src` in directory `package`), and every
    private name of another known file it uses."""
    tree = ast.parse(source)
    edges: list[Edge] = []
    private: list[PrivateUse] = []
    aliases: dict[str, str] = {}  # local name bound to one of our modules -> its stem

    def visit(node: ast.AST, lazy: bool) -> None:
        if isinstance(node, ast.ImportFrom):
            target = _target(package, node)
            if target is not None:
                owner = _stem(target, known)
                for alias in node.names:
                    sub = _stem(f"{target}.{alias.name}", known)
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
                    owner = _stem(alias.name[len(PACKAGE) + 1 :], known)
                    if owner is not None:
                        edges.append(Edge(src, owner, node.lineno, lazy))
                        if alias.asname:
                            aliases[alias.asname] = owner
        inner = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, False)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and _is_private(node.attr)
            and node.attr not in known
        ):
            private.append(PrivateUse(src, aliases[node.value.id], node.attr, node.lineno))
    return [edge for edge in edges if edge.dst != src], [use for use in private if use.dst != src]


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def files() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for directory in DIRS:
        for path in sorted((PLUGINS / directory).glob("*.py")):
            if path.stem == "__init__":
                continue
            assert path.stem not in found, f"{path.stem} is in both {found[path.stem].parent.name} and {directory}"
            found[path.stem] = path
    return found


@functools.cache
def graph() -> tuple[list[Edge], list[PrivateUse]]:
    paths = files()
    known = set(paths)
    edges: list[Edge] = []
    private: list[PrivateUse] = []
    for stem, path in paths.items():
        file_edges, file_private = scan(path.read_text(), stem, path.parent.name, known)
        edges += file_edges
        private += file_private
    return edges, private


def upward(edges: list[Edge]) -> dict[tuple[str, str], list[Edge]]:
    found: dict[tuple[str, str], list[Edge]] = {}
    for edge in edges:
        if edge.src in RANKS and edge.dst in RANKS and RANKS[edge.dst] > RANKS[edge.src]:
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
    pairs = {(e.src, e.dst) for e in edges if e.src in RANKS and e.dst in RANKS and RANKS[e.src] == RANKS[e.dst]}
    return components(set(RANKS), pairs)


def _where(edges: list[Edge]) -> str:
    return ", ".join(f"line {e.line}{' (in a function)' if e.lazy else ''}" for e in edges)


# --- the rules, on the code as it is --------------------------------------------------------------


def test_every_file_has_a_rank() -> None:
    paths = files()
    unranked = sorted(set(paths) - set(RANKS))
    gone = sorted(set(RANKS) - set(paths))
    assert not unranked, f"give these files a rank in RANKS: {unranked}"
    assert not gone, f"these files are gone, remove them from RANKS: {gone}"


def test_no_import_of_a_higher_rank() -> None:
    edges = graph()[0]
    new = {pair: found for pair, found in upward(edges).items() if pair not in KNOWN_UPWARD}
    assert not new, "imports of a higher rank:\n" + "\n".join(
        f"  {src} ({RANK_NAMES[RANKS[src]]}) imports {dst} ({RANK_NAMES[RANKS[dst]]}): {_where(found)}"
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
SYNTHETIC_KNOWN = {"_me", "_low", "_peer", "_other", "_abs", "_abs2", "_high", "_deep", "_high2"}


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
    assert scan(source, "_me", "module_utils", {"_me"}) == ([], [])


def test_checker_finds_cycles_and_upward_edges() -> None:
    pairs = {("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "e"), ("e", "d"), ("f", "a")}
    assert components({"a", "b", "c", "d", "e", "f"}, pairs) == [("a", "b", "c"), ("d", "e")]
    edges = scan("def f():\n    from ._box import boot_box\n", "_docker", "module_utils", set(RANKS))[0]
    assert list(upward(edges)) == [("_docker", "_box")]
    assert edges[0].lazy
