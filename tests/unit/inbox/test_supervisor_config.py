"""agentbox.yaml parsing in agentbox-ctl, and agreement between the parser and the published JSON Schema."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
CTL_PATH = ROOT / "roles" / "inbox_supervisor" / "files" / "agentbox-ctl"
SCHEMA_PATH = ROOT / "docs" / "agentbox-yaml.schema.json"
DOC_PATH = ROOT / "docs" / "agentbox-yaml.md"
FIXTURES = ROOT / "tests" / "fixtures" / "supervisor"


def _load_ctl():
    loader = importlib.machinery.SourceFileLoader("agentbox_ctl", str(CTL_PATH))
    spec = importlib.util.spec_from_loader("agentbox_ctl", loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules["agentbox_ctl"] = module  # dataclasses look their module up while the file executes
    loader.exec_module(module)
    return module


ctl = _load_ctl()
SCHEMA = json.loads(SCHEMA_PATH.read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


def fixtures(kind: str) -> list[Path]:
    found = sorted((FIXTURES / kind).glob("*.yaml"))
    assert found, f"no fixtures in {FIXTURES / kind}"
    return found


def expectations(path: Path) -> list[tuple[str, int]]:
    """`# expect: <key> @<line>` header lines: an error must name that key on that line."""
    found = []
    for line in path.read_text().splitlines():
        match = re.match(r"^# expect: (.*) @(\d+)$", line)
        if match:
            found.append((match.group(1).strip(), int(match.group(2))))
    assert found, f"{path} has no '# expect:' line"
    return found


def parse(path: Path):
    return ctl.parse_config(path.read_text(), str(path))


def errors(issues):
    return [i for i in issues if i.severity == "error"]


def schema_errors(path: Path) -> list[str]:
    return [e.message for e in VALIDATOR.iter_errors(yaml.safe_load(path.read_text()))]


def test_schema_is_a_valid_draft_2020_12_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


@pytest.mark.parametrize("path", fixtures("valid"), ids=lambda p: p.name)
def test_valid_files_pass_parser_and_schema(path):
    config, issues = parse(path)
    assert config is not None, [i.render(path.name) for i in issues]
    assert not errors(issues)
    assert schema_errors(path) == []


@pytest.mark.parametrize("path", fixtures("invalid"), ids=lambda p: p.name)
def test_invalid_files_fail_parser_and_schema_with_key_and_line(path):
    config, issues = parse(path)
    assert config is None
    found = {(i.key, i.line) for i in errors(issues)}
    for key, line in expectations(path):
        assert (key, line) in found, f"expected an error at {key} line {line}, got {found}"
    assert schema_errors(path), f"the schema accepts {path.name}, which the parser rejects"


@pytest.mark.parametrize("path", fixtures("invalid-semantic"), ids=lambda p: p.name)
def test_whole_file_checks_are_the_parser_s_alone(path):
    """Cycles, unknown needs, duplicate keys...: the parser rejects; a JSON Schema cannot express them."""
    config, issues = parse(path)
    assert config is None
    found = {(i.key, i.line) for i in errors(issues)}
    for key, line in expectations(path):
        assert (key, line) in found, f"expected an error at {key} line {line}, got {found}"
    assert schema_errors(path) == []


@pytest.mark.parametrize("path", fixtures("syntax"), ids=lambda p: p.name)
def test_yaml_syntax_errors_name_line_and_nearest_key(path):
    config, issues = parse(path)
    assert config is None
    assert len(issues) == 1 and issues[0].message.startswith("YAML syntax error")
    key, line = expectations(path)[0]
    assert (issues[0].key, issues[0].line) == (key, line)
    with pytest.raises(yaml.YAMLError):
        yaml.safe_load(path.read_text())


def test_every_error_of_a_file_is_reported_not_only_the_first():
    text = "services:\n  web:\n    command: ./web\n    restart: sometimes\n    autostart: maybe\n    needs: [nope]\n"
    config, issues = ctl.parse_config(text, "agentbox.yaml")
    assert config is None
    # The needs of a unit with errors of its own are checked in the same pass: one run, every problem.
    assert {(i.key, i.line) for i in errors(issues)} == {
        ("services.web.restart", 4), ("services.web.autostart", 5), ("services.web.needs[0]", 6)}


def test_a_bad_command_is_one_error_not_also_a_missing_one():
    text = "tasks:\n  build:\n    command: 5\n    needs: [ghost]\n"
    config, issues = ctl.parse_config(text, "agentbox.yaml")
    assert config is None
    assert [(i.key, i.line) for i in errors(issues)] == [("tasks.build.command", 3), ("tasks.build.needs[0]", 4)]


def test_unknown_keys_warn_with_line_and_suggestion_but_the_file_stays_valid():
    text = "tasks:\n  install:\n    command: npm ci\n    run_onse: true\nservices:\n  web:\n    command: ./w\n    restrat: always\nservics: {}\n"
    config, issues = ctl.parse_config(text, "agentbox.yaml")
    assert config is not None
    warnings = {(i.key, i.line): i.message for i in issues if i.severity == "warning"}
    assert "did you mean 'run_once'" in warnings[("tasks.install.run_onse", 4)]
    assert "did you mean 'restart'" in warnings[("services.web.restrat", 8)]
    assert "did you mean 'services'" in warnings[("servics", 9)]
    assert config.tasks["install"].run_once is False  # the misspelt key really was ignored


def test_extension_keys_and_anchors_are_quiet():
    config, issues = parse(FIXTURES / "valid" / "http-url-and-anchors.yaml")
    assert issues == []
    assert config.services["api"].restart == config.services["ui"].restart == "always"
    assert config.services["ui"].backoff.max_ms == 100


def test_defaults_and_normalisation():
    text = ("services:\n  web:\n    command: ./web\n    ready_when: {http: /health, port: 8000}\n"
            "    expose: {port: 8000}\n    env: {N: 3, DEBUG: true}\n")
    config, _warnings = ctl.parse_config(text, "/workspace/agentbox.yaml")
    web = config.services["web"]
    assert (web.restart, web.autostart, web.stop_timeout_ms) == ("on-failure", True, 10000)
    assert (web.backoff.initial_ms, web.backoff.max_ms, web.backoff.factor) == (500, 30000, 2.0)
    assert web.ready_when.url == "http://127.0.0.1:8000/health"
    assert (web.ready_when.interval_ms, web.ready_when.timeout_ms, web.ready_when.on_timeout) == (
        500, 60000, "mark_unhealthy")
    assert web.env == {"N": "3", "DEBUG": "true"}
    assert config.exposed_service() is web
    assert config.workspace == "/workspace"


def test_backoff_grows_by_factor_and_stops_at_max():
    backoff = ctl.Backoff(initial_ms=500, max_ms=3000, factor=2.0)
    assert [backoff.delay_ms(n) for n in range(1, 6)] == [500, 1000, 2000, 3000, 3000]


def test_marker_key_changes_with_command_cwd_and_env_only():
    base = ctl.TaskSpec(name="install", command="npm ci", cwd="app", env={"A": "1", "B": "2"})
    same = ctl.TaskSpec(name="install", command="npm ci", cwd="app", env={"B": "2", "A": "1"}, needs=["x"], line=9)
    assert base.marker_key() == same.marker_key()
    assert re.fullmatch(r"[0-9a-f]{64}", base.marker_key())
    for changed in (ctl.TaskSpec(name="install", command="npm i", cwd="app", env=base.env),
                    ctl.TaskSpec(name="install", command="npm ci", cwd=None, env=base.env),
                    ctl.TaskSpec(name="install", command="npm ci", cwd="app", env={"A": "1"})):
        assert changed.marker_key() != base.marker_key()


def test_topological_order_puts_needs_first():
    config, _warnings = parse(FIXTURES / "valid" / "full.yaml")
    order = ctl.topological_order(config)
    for name, unit in config.all_units().items():
        for need in unit.needs:
            assert order.index(need) < order.index(name)


def test_the_complete_example_in_the_docs_is_valid_for_parser_and_schema():
    blocks = re.findall(r"```yaml\n(.*?)```", DOC_PATH.read_text(), re.DOTALL)
    assert blocks, "docs/agentbox-yaml.md has no yaml example"
    complete = max(blocks, key=len)
    config, issues = ctl.parse_config(complete, "/workspace/agentbox.yaml")
    assert config is not None, [i.render("docs example") for i in issues]
    assert not issues
    assert list(VALIDATOR.iter_errors(yaml.safe_load(complete))) == []
    assert config.tasks and config.services and config.exposed_service()


def run_validate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CTL_PATH), "validate", *args], capture_output=True, text=True,
                          timeout=30, check=False)


def test_validate_cli_exit_codes_and_messages():
    good = run_validate(str(FIXTURES / "valid" / "full.yaml"))
    assert good.returncode == 0, good.stderr
    assert "valid (2 tasks, 3 services)" in good.stdout
    bad = run_validate(str(FIXTURES / "invalid-semantic" / "unknown-need.yaml"))
    assert bad.returncode == 1
    assert "unknown-need.yaml:7: error: services.web.needs[1]: unknown unit 'instal'; did you mean 'install'?" in bad.stderr
    missing = run_validate("/nonexistent/agentbox.yaml")
    assert missing.returncode == 1 and "no such file" in missing.stderr


def test_validate_cli_json_output():
    result = run_validate("--json", str(FIXTURES / "invalid-semantic" / "cycle.yaml"))
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["valid"] is False
    assert report["issues"][0]["key"] == "tasks.b.needs" and report["issues"][0]["line"] == 8
    assert "a -> c -> b -> a" in report["issues"][0]["message"]


def test_the_projects_egress_keys_are_read_with_their_lines_and_a_bad_word_says_what_to_write():
    text = "egress: open\negress_allow:\n  - pypi.corp.example\n  - ' *.corp.example '\ntasks: {a: echo a}\n"
    config, issues = ctl.parse_config(text, "agentbox.yaml")
    assert issues == [] and config is not None
    assert (config.egress, config.egress_allow) == ("open", ["pypi.corp.example", "*.corp.example"])
    assert config.egress_lines == {"egress": 1, "egress_allow": 3} and config.egress_allow_lines == [3, 4]
    config, issues = ctl.parse_config("egress_allow: a.example, b.example c.example\n", "agentbox.yaml")
    assert config.egress is None and config.egress_allow == ["a.example", "b.example", "c.example"]
    config, issues = ctl.parse_config("egress: opne\negres: none\n", "agentbox.yaml")
    assert config is None
    assert [i.render("agentbox.yaml") for i in issues] == [
        "agentbox.yaml:1: error: egress: expected allowlist (the default list plus egress_allow), open (any public "
        "host, audited) or none (no network), got str 'opne'; did you mean 'open'?",
        "agentbox.yaml:2: warning: egres: unknown top-level key, ignored; did you mean 'egress'?"]
