#!/usr/bin/python
# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: agentbox_agent
short_description: Start or stop a coding agent (Claude Code, Codex, OpenCode, or any command) in a box
version_added: 0.1.0
description:
  - Runs the agent as C(vscode) in C(/workspace), in a detached tmux session named after it, so it keeps
    working with nobody attached; the result's RV(attach) says how to attach.
  - The box is the sandbox, so the CLI's permission prompts are skipped by default
    (C(--dangerously-skip-permissions) for Claude Code, C(--dangerously-bypass-approvals-and-sandbox) for
    Codex); O(skip_permissions=false) keeps them.
  - Idempotent; a running session is left alone, except that a O(prompt) given while it runs is typed into it
    and submitted, as a person attached to it would (RV(sent)). O(state=stopped) ends the CLI gracefully (SIGTERM,
    then the tmux session after 10 seconds). O(state=query) changes nothing and reports the session's state;
    O(transcript) returns the last lines of its screen (RV(transcript)) without attaching.
  - An agent that reports V(working) but has made no progress (its transcript or state file unchanged) for
    O(stalled_minutes) is reported as V(stalled), since its last progress.
  - A stopped box is started (and a paused one resumed) first. After a box stop and start, or a restore
    from a checkpoint, every session that was started runs again and resumes its last conversation
    (C(claude --continue), C(codex resume --last), C(opencode --continue)).
  - Credentials come from the host user and are never written to an image, a label, the container's
    config or a checkpoint; they go to the C(/run/agentbox) tmpfs. Looked for, first found wins - O(env),
    the controller's environment (C(ANTHROPIC_*) and C(CLAUDE_CODE_*) for Claude Code, C(OPENAI_*) for Codex,
    both for OpenCode), the boxes' own sign-in (C(playbooks/agent_login.yml), kept in
    C(~/.agentbox/agents/<agent>/)), then the CLI's sign-in files in the host user's home
    (C(~/.claude/.credentials.json) and the account of C(~/.claude.json), C(~/.codex/auth.json),
    C(~/.local/share/opencode/auth.json)). Host files are only read. When nothing is found the agent
    starts anyway, with a warning that says where it looked.
  - The box commits as the host user (C(user.name) and C(user.email) of the workspace's effective git config,
    nothing else of it).
  - The CLI's hooks report C(working), C(idle), C(waiting) and C(stopped) with C(agentbox-ctl agent-state);
    first-run dialogs (onboarding, folder trust, the permission-skipping warning) are answered in the
    CLI's own settings in the box.
author:
  - agentbox.box developers (@agentbox)
extends_documentation_fragment:
  - agentbox.box.provider
  - agentbox.box.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
options:
  box:
    description: The box's name.
    type: str
    required: true
  agent:
    description:
      - V(claude), V(codex) or V(opencode); its CLI must be in the box's image (role variable
        C(box_image_agents)).
      - With O(command), any name (it labels the state the command reports).
    type: str
    default: claude
  command:
    description:
      - A command line run by C(bash -lc) instead of a known CLI (no permission flag, no resume; it is started
        again as it is). It can report states with C(agentbox-ctl agent-state STATE).
    type: str
  state:
    description: V(started), V(stopped), or V(query) (report the session's state; start and stop nothing).
    type: str
    choices: [started, stopped, query]
    default: started
  prompt:
    description:
      - The first prompt, passed to the CLI intact (quotes, newlines, any unicode) when the session starts;
        never sent again on a resume.
      - When the session already runs, the prompt is pasted into it as one block and submitted with Enter
        (tmux, as typed at its prompt); it travels on the exec's standard input, never in a command line.
      - With O(command), the first prompt is typed in the same way once the command runs (a command line of
        your own has no place for it).
    type: str
  transcript:
    description:
      - Return the last this many lines of the session's screen and scroll-back in RV(transcript) (0, the
        default, none; at most 2000). What C(tmux attach) would show, without attaching.
    type: int
    default: 0
  stalled_minutes:
    description:
      - An agent V(working) with no progress for this many minutes is reported as V(stalled). Progress is its
        state file or, for Claude Code, Codex and OpenCode, its transcript changing (docs/agents.md).
    type: float
    default: 10
  session:
    description: The tmux session name. Default the agent's name.
    type: str
  args:
    description: Extra arguments for the CLI, after the ones this module adds.
    type: list
    elements: str
    default: []
  skip_permissions:
    description: Add the CLI's permission-skipping flag.
    type: bool
    default: true
  env:
    description:
      - Extra variables for the agent's process (keys, tokens, C(ANTHROPIC_BASE_URL)...); they win over the
        controller's environment. Written to the tmpfs, never logged.
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Claude Code in the box, with a first task
  agentbox.box.agentbox_agent:
    box: fix-login
    prompt: "Fix the login redirect and add a test"

- name: Codex with its approvals kept
  agentbox.box.agentbox_agent:
    box: fix-login
    agent: codex
    skip_permissions: false

- name: One more task for the running agent, then its last 40 lines
  agentbox.box.agentbox_agent:
    box: fix-login
    prompt: "Also update the changelog"
    transcript: 40

- name: Stop it
  agentbox.box.agentbox_agent:
    box: fix-login
    state: stopped
"""

RETURN = r"""
box:
  description: The box's facts (see M(agentbox.box.agentbox_box)), with C(agent) added.
  returned: always
  type: dict
  contains:
    agent:
      description:
        - The session's agent as its hooks last reported it; null when none ever ran. C(state) is V(working),
          V(idle), V(waiting), V(stopped), or V(stalled) (see O(stalled_minutes)); with O(state=query) it is this
          session's, otherwise the box's current one.
      type: dict
      returned: always
      sample: {"name": "claude", "session": "claude", "state": "idle", "since": "2026-11-30T17:30:00Z"}
session:
  description: The tmux session.
  returned: always
  type: str
attach:
  description: The command that attaches to the session, for the box's provider.
  returned: always
  type: str
  sample: docker exec -it -u vscode agentbox-fix-login tmux attach -t claude
credentials:
  description: Names of the credentials handed to the agent (variable names and C(~/) paths; never values).
  returned: when O(state=started)
  type: list
  elements: str
sent:
  description: The O(prompt) was typed into the session (one that was already running, or a O(command)'s).
  returned: when it was
  type: bool
transcript:
  description:
    - The last O(transcript) lines of the session's screen, control characters removed; empty when no session
      runs.
  returned: when O(transcript) is given
  type: list
  elements: str
"""


from ansible_collections.agentbox.box.plugins.module_utils.providers._module import (
    PROVIDER_ARGUMENT_SPEC,
    provider_from_params,
    run_task_module,
)
from ansible_collections.agentbox.box.plugins.module_utils.tasks._agent_task import AGENT_ARGUMENT_SPEC, run_agent_task


def _run_agent_task(params: dict, check_mode: bool) -> tuple[dict, list[str]]:
    return run_agent_task(params, provider_from_params(params), check_mode)


def main() -> None:
    run_task_module({**AGENT_ARGUMENT_SPEC, **PROVIDER_ARGUMENT_SPEC}, _run_agent_task)


if __name__ == "__main__":
    main()
