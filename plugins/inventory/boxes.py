# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: boxes
short_description: Every agentbox box as an Ansible host
version_added: 0.1.0
description:
  - Lists the boxes on the local Docker engine, on remote Docker engines reached over SSH, on Daytona and on boxd, found
    by their C(io.agentbox.*) labels, and makes each one a host reached with the P(agentbox.box.box#connection)
    connection plugin.
  - The configuration file must be a YAML file whose name ends with V(agentbox.yml) or V(agentbox.yaml),
    for example C(dev.agentbox.yml).
  - "Groups always present: V(docker), V(docker_ssh), V(daytona), V(boxd) (by provider), V(running), V(paused), V(stopped)
    (by state), V(agent_working), V(agent_idle), V(agent_waiting), V(agent_stalled) (by the state of the box's
    coding agent), C(engine_<destination>) (by engine, V(engine_local) for the local one) and C(project_<project>)."
  - "Every box gets C(agentbox_agent_state): V(working), V(idle), V(waiting), V(stalled), V(stopped), null when no
    agent ever ran in it (or the box is not running), or V(unknown) when the relay has not read it lately; see
    O(agent_state) and O(agent_state_source)."
  - Every value read from an engine is marked unsafe, so no label or name is ever templated.
  - An engine that cannot be reached gives a warning naming it; the boxes of the other engines still load.
author:
  - agentbox.box developers (@agentbox)
extends_documentation_fragment:
  - ansible.builtin.constructed
  - ansible.builtin.inventory_cache
options:
  plugin:
    description: The name of this plugin; always V(agentbox.box.boxes).
    required: true
    type: str
    choices: [agentbox.box.boxes]
  local:
    description: List the boxes of the local Docker engine (C(DOCKER_HOST) is honoured).
    type: bool
    default: true
  engines:
    description:
      - Remote Docker engines reached over SSH (provider V(docker_ssh)), as C(~/.ssh/config) aliases or
        C(user@host[:port]).
    type: list
    elements: str
    default: []
  daytona:
    description:
      - List the boxes of a Daytona organisation. Omit to skip Daytona.
      - The API key is read from C(DAYTONA_API_KEY) unless O(daytona.api_key) is given; it never becomes a host
        variable (the connection plugin reads the same environment variable).
    type: dict
    suboptions:
      api_url:
        description: API URL. Default C(DAYTONA_API_URL), else the SDK's default.
        type: str
      api_key:
        description: API key. Default C(DAYTONA_API_KEY).
        type: str
      target:
        description: Target (region). Default C(DAYTONA_TARGET).
        type: str
  boxd:
    description:
      - List the boxes on boxd. Omit to skip boxd.
      - The credential is read from C(BOXD_API_KEY) or C(BOXD_TOKEN) unless O(boxd.api_key) is given; it never
        becomes a host variable (the connection plugin reads the same environment variables).
    type: dict
    suboptions:
      base_url:
        description: The boxd cluster. Default C(BOXD_BASE_URL), else production.
        type: str
      api_key:
        description: API key. Default C(BOXD_API_KEY).
        type: str
      org:
        description: The org whose machines are listed. Default C(BOXD_ORG).
        type: str
  projects:
    description:
      - Only boxes of these projects, each a project id (16 hex digits) or a workspace path.
    type: list
    elements: str
    default: []
  states:
    description: Only boxes in these states.
    type: list
    elements: str
    choices: [running, paused, stopped]
    default: []
  include:
    description: Only boxes whose name matches one of these shell patterns (C(fix-*)).
    type: list
    elements: str
    default: []
  exclude:
    description: Leave out boxes whose name matches one of these shell patterns. Applied after O(include).
    type: list
    elements: str
    default: []
  verbose_output:
    description:
      - Also set every fact of the box as a host variable (C(agentbox_id), C(agentbox_project),
        C(agentbox_labels), C(agentbox_image), ...). They are always available to O(compose), O(groups) and
        O(keyed_groups).
    type: bool
    default: false
  agent_state:
    description:
      - Set C(agentbox_agent_state) and the C(agent_*) groups from each running box's coding agent (see
        O(agent_state_source)). V(false) skips that (C(agentbox_agent_state) is then null).
    type: bool
    default: true
  agent_state_source:
    description:
      - "V(relay): the states the host relay last read (C(~/.agentbox/relay/agents.json), one file for every box,
        no exec): the relay reads every running box it serves at each idle-policy pass (every 30 s by default). A
        running box it has not read within three passes (at least 90 s) is V(unknown): no relay runs, the idle
        policy is switched off, or the box is someone else's. docs/agents.md."
      - V(boxes) asks every running box instead (one exec each, side by side on the local engine).
    type: str
    choices: [relay, boxes]
    default: relay
  stalled_minutes:
    description:
      - An agent V(working) with no progress (its transcript or state file unchanged) for this many minutes is
        shown as V(stalled).
    type: float
    default: 10
  configure_connection:
    description:
      - Set C(ansible_connection=agentbox.box.box) and C(ansible_python_interpreter=/usr/bin/python3) (the box
        image's) on every box. A C(compose) entry for either still wins; set V(false) to choose them in
        C(group_vars) instead.
    type: bool
    default: true
"""

EXAMPLES = r"""
# dev.agentbox.yml: the boxes of this machine
plugin: agentbox.box.boxes

# fleet.agentbox.yml: local and two remote engines, running boxes of one project, grouped by base branch
plugin: agentbox.box.boxes
engines:
  - builder1
  - root@127.0.0.1:2201
projects:
  - /home/me/src/app
states: [running]
exclude: ["scratch-*"]
keyed_groups:
  - key: agentbox_labels.base_branch
    prefix: base
compose:
  ansible_user: "'root' if agentbox_box is match('ops-') else 'vscode'"
cache: true
cache_plugin: ansible.builtin.jsonfile
cache_connection: ~/.cache/agentbox-inventory
cache_timeout: 60
"""

import contextlib
import fnmatch
import os
import time
from typing import Any

from ansible import context
from ansible.errors import AnsibleError, AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin, Cacheable, Constructable
from ansible.plugins.loader import connection_loader

try:
    # First: the module_utils below then load from Python's bytecode cache (plugin_utils/_bytecode.py).
    from ansible_collections.agentbox.box.plugins.plugin_utils import _bytecode

    _bytecode.install()

    # isort: split

    from ansible_collections.agentbox.box.plugins.module_utils.agent import _agent_record
    from ansible_collections.agentbox.box.plugins.module_utils.agent._agent import agents_of, checked, judged
    from ansible_collections.agentbox.box.plugins.module_utils.core._naming import project_id, sanitize_group
    from ansible_collections.agentbox.box.plugins.module_utils.core._provider import ProviderError
    from ansible_collections.agentbox.box.plugins.module_utils.providers._registry import (
        CLOUD_SETTINGS,
        PROVIDERS,
        cloud_settings,
    )
    from ansible_collections.agentbox.box.plugins.plugin_utils._providers import (
        BOX_PYTHON,
        CONNECTION_PLUGIN,
        LOCAL_ENGINE,
        VAR_BOX,
        VAR_ENGINE,
        VAR_PROVIDER,
        make_unsafe,
        provider_for,
    )

    IMPORT_ERROR: Exception | None = None
except ImportError as exc:  # pragma: no cover - reported by parse()
    IMPORT_ERROR = exc

STATE_GROUPS = ("running", "paused", "stopped")
AGENT_GROUPS = ("working", "idle", "waiting", "stalled")  # agent_<state>
# Cache format: bump when the stored listing changes shape.
LISTING_VERSION = 3
UNKNOWN_AGENT = {"name": None, "session": None, "state": "unknown", "since": None}


class InventoryModule(BaseInventoryPlugin, Constructable, Cacheable):
    NAME = "agentbox.box.boxes"

    def verify_file(self, path: str) -> bool:
        if not super().verify_file(path):
            return False
        if path.endswith(("agentbox.yml", "agentbox.yaml")):
            return True
        self.display.vvv(f"{path}: skipped by agentbox.box.boxes, whose files end in agentbox.yml or agentbox.yaml")
        return False

    # -- sources ---------------------------------------------------------------------------------
    def _sources(self) -> list[dict[str, Any]]:
        """Where to look: [{'provider', 'engine', 'options'}], in the order hosts are added."""
        sources: list[dict[str, Any]] = []
        if self.get_option("local"):
            sources.append({"provider": "docker", "engine": LOCAL_ENGINE, "options": {}})
        for destination in self.get_option("engines") or []:
            if not isinstance(destination, str) or not destination.strip():
                raise AnsibleParserError(f"engines: {destination!r} is not an SSH destination such as user@host:2201")
            sources.append({"provider": "docker_ssh", "engine": destination.strip(), "options": {}})
        for provider, settings in CLOUD_SETTINGS.items():  # in the order their hosts are added
            given = self.get_option(provider)
            if given is None:
                continue
            if not isinstance(given, dict):
                keys = ", ".join(setting.keyword for setting in settings)
                raise AnsibleParserError(f"{provider}: must be a mapping ({keys}) or omitted")
            options = cloud_settings(provider, lambda setting, given=given: given.get(setting.keyword))
            # The engine is the API's URL (the first key), else the provider's name.
            engine = next(iter(options.values())) or provider
            sources.append({"provider": provider, "engine": engine, "options": options})
        return sources

    def _fetch_listing(self, sources: list[dict[str, Any]]) -> dict[str, Any]:
        """The raw listing: what each source answered (box facts as dicts) or why it did not."""
        listing: dict[str, Any] = {"version": LISTING_VERSION, "sources": []}
        now = time.time()
        # One file for every box, read once: the relay keeps it current (no exec per box).
        record = _agent_record.fresh(now) if self.get_option("agent_state_source") == "relay" else None
        stalled = float(self.get_option("stalled_minutes"))
        for source in sources:
            entry = {"provider": source["provider"], "engine": source["engine"], "boxes": [], "error": None}
            try:
                provider = provider_for(source["provider"], source["engine"], source["options"])
                entry["boxes"] = [facts.to_dict() for facts in provider.list_boxes()]
                if self.get_option("agent_state"):
                    running = [box["name"] for box in entry["boxes"] if box["state"] == "running"]
                    if record is None:
                        agents = {name: judged(agent, stalled, now) for name, agent in agents_of(provider, running).items()}
                    else:
                        agents = {box["name"]: self._recorded_agent(box, record, stalled, now)
                                  for box in entry["boxes"] if box["state"] == "running"}  # fmt: skip
                    for box in entry["boxes"]:
                        box["agent"] = agents.get(box["name"])
            except ProviderError as exc:
                entry["error"] = str(exc)
            except Exception as exc:  # noqa: BLE001 - one bad engine must not sink the inventory
                entry["error"] = f"{type(exc).__name__}: {exc}"
            listing["sources"].append(entry)
        return listing

    @staticmethod
    def _recorded_agent(box: dict[str, Any], record: dict[str, Any], stalled: float, now: float) -> dict[str, Any] | None:
        """The relay's read of this box (same id and name), its values checked again and judged for stalls as of
        now; unknown when there is none (or it is not of the expected shape)."""
        seen = record.get(str(box.get("id")))
        if seen is None or seen["name"] != box.get("name"):
            return dict(UNKNOWN_AGENT)
        if seen["agent"] is None:
            return None  # read: no agent in it
        agent = checked(seen["agent"])
        return judged(agent, stalled, now, elapsed=now - seen["read"]) if agent else dict(UNKNOWN_AGENT)

    # -- parse -----------------------------------------------------------------------------------
    def parse(self, inventory: Any, loader: Any, path: str, cache: bool = True) -> None:
        super().parse(inventory, loader, path, cache)
        if IMPORT_ERROR is not None:
            raise AnsibleError(f"agentbox.box.boxes could not load the collection's provider code: {IMPORT_ERROR}")
        self._read_config_data(path)
        sources = self._sources()
        cache_key = self.get_cache_key(path)
        use_cache = self.get_option("cache") and cache
        listing = None
        if use_cache:
            try:
                listing = self._cache[cache_key]
            except KeyError:
                listing = None
            if not isinstance(listing, dict) or listing.get("version") != LISTING_VERSION:
                listing = None
        came_from_cache = listing is not None
        if listing is None:
            listing = self._fetch_listing(sources)
        self._populate(listing)
        # Write only complete listings: a failed engine is asked again next time.
        complete = all(entry["error"] is None for entry in listing["sources"])
        if self.get_option("cache") and not came_from_cache and complete:
            self._cache[cache_key] = listing
        if self.get_option("configure_connection") and self.inventory.hosts and "graph" not in context.CLIARGS:
            # Load the box connection plugin here, in the controller, before Ansible forks a worker
            # per task: every worker inherits it instead of compiling it and parsing its options.
            # Not for ansible-inventory (the one CLI with --graph), which connects to nothing.
            with contextlib.suppress(Exception):
                connection_loader.get(CONNECTION_PLUGIN, class_only=True)

    def _populate(self, listing: dict[str, Any]) -> None:
        """Build groups and hosts from a raw listing (no engine I/O here: unit tests feed it)."""
        for group in (*PROVIDERS, *STATE_GROUPS, *(f"agent_{state}" for state in AGENT_GROUPS)):
            self.inventory.add_group(group)
        strict = self.get_option("strict")
        seen_hosts: dict[str, str] = {}
        for entry in listing.get("sources", []):
            provider, engine = entry["provider"], entry["engine"]
            engine_group = self.inventory.add_group("engine_" + sanitize_group(engine))
            if entry.get("error"):
                self.display.warning(
                    f"agentbox.box.boxes: {provider} engine {engine!r} could not be listed, its boxes are left "
                    f"out: {entry['error']}"
                )
                continue
            for raw in entry.get("boxes", []):
                if not self._wanted(raw):
                    continue
                host = self._host_name(raw, engine, seen_hosts)
                self._add_box(host, raw, provider, engine, engine_group, strict)

    def _project_filter(self) -> set[str]:
        wanted = set()
        for item in self.get_option("projects") or []:
            text = str(item)
            wanted.add(project_id(os.path.realpath(os.path.expanduser(text))) if "/" in text else text)
        return wanted

    def _wanted(self, raw: dict[str, Any]) -> bool:
        projects = self._project_filter()
        if projects and raw.get("project") not in projects:
            return False
        states = self.get_option("states") or []
        if states and raw.get("state") not in states:
            return False
        name = str(raw.get("name", ""))
        include = self.get_option("include") or []
        if include and not any(fnmatch.fnmatchcase(name, pattern) for pattern in include):
            return False
        exclude = self.get_option("exclude") or []
        return not any(fnmatch.fnmatchcase(name, pattern) for pattern in exclude)

    def _host_name(self, raw: dict[str, Any], engine: str, seen: dict[str, str]) -> str:
        """The box name; a second box of that name on another engine gets '@<engine>' appended."""
        name = str(raw["name"])
        if name in seen and seen[name] != engine:
            alias = f"{name}@{engine}"
            self.display.warning(
                f"agentbox.box.boxes: box {name!r} exists on engines {seen[name]!r} and {engine!r}; "
                f"the second is host {alias!r}"
            )
            return alias
        seen[name] = engine
        return name

    def _add_box(self, host: str, raw: dict[str, Any], provider: str, engine: str, engine_group: str, strict: bool):
        labels = raw.get("labels") or {}
        minimal = {
            VAR_BOX: raw.get("name"),
            "agentbox_state": raw.get("state"),
            "agentbox_branch": raw.get("branch"),
            "agentbox_workspace": raw.get("workspace"),
            VAR_PROVIDER: provider,
            VAR_ENGINE: engine,
            "agentbox_ports": raw.get("ports") or {},
            "agentbox_agent_state": (raw.get("agent") or {}).get("state"),
        }
        # The cloud's non-secret settings, for the connection plugin (an API key never becomes a host variable).
        given = self.get_option(provider) if provider in CLOUD_SETTINGS else None
        settings = cloud_settings(provider, lambda setting: (given or {}).get(setting.keyword))
        minimal.update({s.host_var: settings[s.keyword] for s in CLOUD_SETTINGS.get(provider, ()) if not s.secret})
        full = {
            **minimal,
            "agentbox_id": raw.get("id"),
            "agentbox_project": raw.get("project"),
            "agentbox_container": raw.get("container"),
            "agentbox_image": raw.get("image"),
            "agentbox_created": raw.get("created"),
            "agentbox_checkpoint": raw.get("checkpoint"),
            "agentbox_web_url": raw.get("web_url"),
            "agentbox_base_branch": labels.get("base_branch"),
            "agentbox_base_commit": labels.get("base_commit"),
            "agentbox_labels": labels,
            "agentbox_agent": raw.get("agent"),
        }
        verbose = self.get_option("verbose_output")
        constructed = any(self.get_option(option) for option in ("compose", "groups", "keyed_groups"))
        # Every fact is wrapped only when something reads them (wrapping them is most of a host's cost).
        full = make_unsafe(full) if verbose or constructed else {}
        self.inventory.add_host(host)
        host_vars = full if verbose else make_unsafe(minimal)
        for key, value in host_vars.items():
            self.inventory.set_variable(host, key, value)
        if self.get_option("configure_connection"):
            self.inventory.set_variable(host, "ansible_connection", CONNECTION_PLUGIN)
            full["ansible_connection"] = CONNECTION_PLUGIN
            # Every box runs the box image's Debian python3: no interpreter discovery (a round trip
            # and a warning per box when no ansible.cfg silences it).
            self.inventory.set_variable(host, "ansible_python_interpreter", BOX_PYTHON)
            full["ansible_python_interpreter"] = BOX_PYTHON
        if provider in PROVIDERS:
            self.inventory.add_child(provider, host)
        state = raw.get("state")
        if state in STATE_GROUPS:
            self.inventory.add_child(state, host)
        self.inventory.add_child(engine_group, host)
        agent_state = (raw.get("agent") or {}).get("state")
        if agent_state in AGENT_GROUPS:
            self.inventory.add_child(f"agent_{agent_state}", host)
        if raw.get("project"):
            project_group = self.inventory.add_group("project_" + sanitize_group(str(raw["project"])))
            self.inventory.add_child(project_group, host)
        if not constructed:
            return
        # compose runs last so a user's ansible_connection (or anything else) wins.
        self._set_composite_vars(self.get_option("compose"), full, host, strict=strict)
        self._add_host_to_composed_groups(self.get_option("groups"), full, host, strict=strict)
        self._add_host_to_keyed_groups(self.get_option("keyed_groups"), full, host, strict=strict)
