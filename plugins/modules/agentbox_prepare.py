#!/usr/bin/python
# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: agentbox_prepare
short_description: Make a first create's box image ready on an engine ahead of time
version_added: 0.1.0
description:
  - A create on a remote engine that lacks the box image streams it there first (a minute or more for the
    1.1 GB image). This module does that ahead of time, so the first create is as fast as the next ones.
  - Remote engines (O(provider=docker_ssh)) - the image is streamed from the local engine when the engine lacks
    it or holds another image under that name; nothing is sent when the same image is there.
  - Local engine, Daytona and boxd - the image (or snapshot) must already be there; a missing one fails and says
    how to make it.
  - Each run is recorded in C(~/.agentbox/prepared.json) under C(<provider>:<engine>) (the image, when it was
    first made ready there, when it was last checked).
  - Runs on the controller.
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
  image:
    description: The box image a create there would use.
    type: str
    default: agentbox/box:latest
"""

EXAMPLES = r"""
- name: The box image on a remote engine before the first box
  agentbox.box.agentbox_prepare:
    provider: docker_ssh
    engine: builder1
"""

RETURN = r"""
where:
  description: C(<provider>:<engine>).
  returned: always
  type: str
  sample: docker_ssh:builder1
image:
  description: The image.
  returned: always
  type: str
path:
  description: V(present) (already there), V(streamed) (streamed there now), V(pulled) (pulled there), V(would copy) (check mode).
  returned: always
  type: str
transfer:
  description: The stream's figures when one ran (C(image_bytes), C(bytes_sent), C(seconds)); empty otherwise.
  returned: always
  type: dict
"""

from ansible_collections.agentbox.box.plugins.module_utils.box import _prepare
from ansible_collections.agentbox.box.plugins.module_utils.providers._module import (
    provider_from_params,
    run_provider_module,
)


def _run(module) -> dict:
    return _prepare.prepare(provider_from_params(module.params), module.params["image"], module.check_mode)


def main() -> None:
    run_provider_module({"image": {"type": "str", "default": "agentbox/box:latest"}}, _run)


if __name__ == "__main__":
    main()
