"""The fleet page (playbooks/templates/fleet_status.html.j2) rendered and measured in headless Chromium.

`render_page` writes the page from prepared rows with the template the playbook uses, through
Ansible's own template module (no boxes needed); `measure_page` loads a copy of a page with a
measuring script added (the page itself has no script) in Debian's chromium at a given window width
and returns what the script measured in the laid-out page.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
VENV_BIN = REPO / ".venv" / "bin"
TEMPLATE = REPO / "playbooks" / "templates" / "fleet_status.html.j2"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]  # fmt: skip

# Leaves its answer as JSON in <body data-measure>. lines(el): how many line boxes el's text takes,
# counted as the distinct tops of its text's client rects (an inline-block or a line-clamped box is
# one rect however its text wraps inside; the text's own rects are not). cut(el): el shows less than
# its text (clipped sideways, or lines hidden below a clamp).
MEASURE = """<script>
window.addEventListener('load', () => {
  const root = document.documentElement;
  const lines = el => { const range = document.createRange(); range.selectNodeContents(el);
    return new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top))).size; };
  const cut = el => el.scrollWidth > el.clientWidth || el.scrollHeight > el.clientHeight || lines(el) > 1;
  const field = (row, name) => row.querySelector(`[data-field=${name}]`);
  const text = (row, name) => { const el = field(row, name); return el ? el.textContent.trim() : null; };
  const cls = (row, name) => { const el = field(row, name); return el ? el.className : null; };
  const shown = el => el ? {text: el.textContent.trim(), title: el.title, lines: lines(el), cut: cut(el)} : null;
  const rows = [...document.querySelectorAll('tr.box-row')].map(row => ({
    box: row.dataset.box, state: row.dataset.state, branch: text(row, 'branch'), provider: text(row, 'provider'),
    engine: text(row, 'engine'), web: text(row, 'web'), web_href: field(row, 'web')?.href || null,
    ahead: text(row, 'ahead'), behind: text(row, 'behind'), files: text(row, 'files'),
    insertions: text(row, 'insertions'), deletions: text(row, 'deletions'), uncommitted: text(row, 'uncommitted'),
    ahead_class: cls(row, 'ahead'), behind_class: cls(row, 'behind'), deletions_class: cls(row, 'deletions'),
    branch_shown: shown(field(row, 'branch')), base_shown: shown(field(row, 'base')),
    subject_shown: shown(row.querySelector('.subject .line')),
    right: Math.ceil(row.getBoundingClientRect().right)}));
  const headers = [...document.querySelectorAll('#fleet thead th')]
    .map(th => ({text: th.textContent, lines: lines(th), visible: th.getClientRects().length > 0}));
  const wide = [...document.querySelectorAll('body *')].filter(el => el.getBoundingClientRect().right > root.clientWidth + 0.5)
    .map(el => el.tagName + '.' + el.className);
  document.body.setAttribute('data-measure', JSON.stringify({
    scrollWidth: root.scrollWidth, clientWidth: root.clientWidth, rows, headers, wide: wide.slice(0, 10),
    broken: rows.filter(row => row.branch_shown && row.branch_shown.lines > 1).map(row => row.branch),
    generated: document.getElementById('generated')?.getAttribute('datetime'),
    uncommittedTile: document.querySelector('[data-tile=uncommitted] b')?.textContent}));
});
</script>"""


def chromium_binary() -> str:
    for candidate in ("chromium", "chromium-browser"):
        if found := shutil.which(candidate):
            return found
    pytest.fail("no chromium on PATH: run scripts/ensure-browser.sh (scripts/test.sh runs it during set-up)")


def render_page(rows: list[dict], dest: Path, generated: str = "2025-01-01 12:00:00 UTC") -> Path:
    """The page for these rows (as fleet_status.yml's `fleet_row`s), written by the playbook's template."""
    extra = dest.with_suffix(".vars.json")
    extra.write_text(json.dumps({"fleet_rows": rows, "fleet_generated": generated}), encoding="utf-8")
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}"}  # fmt: skip
    done = subprocess.run(
        [str(VENV_BIN / "ansible"), "-i", "localhost,", "-c", "local", "localhost",
         "-e", f"ansible_python_interpreter={VENV_BIN / 'python'}", "-e", f"@{extra}",
         "-m", "ansible.builtin.template", "-a", f"src={TEMPLATE} dest={dest} mode=0644"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return dest


def measure_page(page: Path, width: int, height: int = 900) -> dict:
    """What MEASURE finds in the page laid out by Chromium in a window `width` px wide."""
    probe = page.with_name(f"measured-{width}-{page.name}")
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", MEASURE + "\n</body>"), encoding="utf-8")
    profile = tempfile.mkdtemp(prefix="agentbox-chromium-")
    try:
        dom = subprocess.run([chromium_binary(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                              f"--window-size={width},{height}", "--dump-dom", probe.as_uri()],
                             capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'data-measure="([^"]*)"', dom.stdout)
    assert found, dom.stdout[-2000:]
    return json.loads(html.unescape(found.group(1)))
