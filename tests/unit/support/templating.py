"""Render a template with Ansible's own templating in the pytest process (no `ansible` process): the
collection's filters and lookups load through the collection loader tests/conftest.py installs, and the
expression is trusted as a playbook's own text is."""

from __future__ import annotations

from typing import Any

from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template


def render(template: str, variables: dict[str, Any]) -> Any:
    """What Ansible makes of `template` ("{{ rows | agentbox.box.box_table }}", a lookup...) with `variables`."""
    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(template))
