#!/usr/bin/python
# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: agentbox_image
short_description: Find or build the agentbox box image from a rendered build context
version_added: 0.1.0
description:
  - Fingerprints a build context (a rendered C(Dockerfile) plus the files it copies) and makes sure the
    Docker engine has the image of that fingerprint, tagged C(<tag>:<first 16 hex of the fingerprint>)
    and C(<tag>:latest), with the labels C(io.agentbox.image_fingerprint) and C(io.agentbox.kind=image).
  - When that tag already exists nothing is built and the task reports no change (it only makes sure
    C(<tag>:latest) points at it).
  - Otherwise the base image is used if present, else pulled, else (for C(debian:<codename>) bases) made
    from Debian's packages with C(debootstrap) and imported; then the image is built with the Docker
    engine's classic builder. The build output goes to O(build_log), not into Ansible's output.
  - The role M(agentbox.box.box_image) renders the context from its template and calls this module; use
    the role rather than the module directly.
  - The engine is this machine's box engine, or with O(isolation=none) the local one (C(DOCKER_HOST) and the
    other C(DOCKER_*) variables are honoured).
options:
  dockerfile:
    description:
      - The rendered C(Dockerfile) text. The build context is then this C(Dockerfile), O(programs) under
        C(bin/) and O(ca_certificates) under C(ca/); this is how the role calls the module.
      - Exactly one of O(dockerfile) and O(context) is required.
    type: str
  programs:
    description:
      - Programs for the context, by file name; they are put in C(bin/<name>) with mode 0755 (the role's
        C(Dockerfile) copies them to C(/usr/local/bin/)).
      - Only with O(dockerfile); with O(context) the task fails and says to put them in the directory.
    type: dict
    default: {}
  libraries:
    description:
      - Library files for the context, by relative path (for example C(agentbox_inbox/cli.py)); they are put in
        C(lib/<path>) with mode 0644 (the role's C(Dockerfile) copies them to C(/usr/local/lib/agentbox/), root-owned).
      - Only with O(dockerfile); with O(context) the task fails and says to put them in the directory.
    type: dict
    default: {}
  ca_certificates:
    description:
      - PEM texts of extra certificate authorities, put in C(ca/agentbox-ca-<n>.crt) in this order (so the
        texts and their order are part of the fingerprint).
      - Only with O(dockerfile); with O(context) the task fails and says to put them in the directory.
    type: list
    elements: str
    default: []
  context:
    description:
      - A directory holding a rendered C(Dockerfile) and the files it copies, instead of O(dockerfile).
      - Every file in it (with its executable bit) is part of the fingerprint, and exactly those files are
        sent to the engine.
    type: path
  base:
    description:
      - The base image the C(Dockerfile) starts from (its C(FROM)). Made ready before the build; recorded in
        the label C(io.agentbox.base), and part of the fingerprint when not the default.
    type: str
    default: debian:bookworm
  tag:
    description:
      - Image repository (without a tag) to tag the image in.
    type: str
    default: agentbox/box
  agents:
    description:
      - npm packages the rendered context installs globally; recorded in the label C(io.agentbox.agents).
      - The role renders them into the C(Dockerfile); the module only records them. Like O(vnc) and O(base),
        a value other than the default is part of the fingerprint, so an image is reused only with the
        labels it was built with.
    type: list
    elements: str
    default: []
  vnc:
    description:
      - Whether the rendered context installs the VNC desktop; recorded in the label C(io.agentbox.vnc),
        and part of the fingerprint when true.
    type: bool
    default: false
  build_log:
    description:
      - File that receives the output of a build (debootstrap, import and docker build). Overwritten by
        each build; untouched when nothing is built.
    type: path
    default: ~/.agentbox/logs/box-image.log
  force:
    description:
      - Build again without the layer cache even when the image of this fingerprint exists.
    type: bool
    default: false
  allow_base_build:
    description:
      - When the base image is neither on the engine nor pullable, make it from Debian's packages with
        C(debootstrap) (needs root and a Debian mirror in the host's apt sources).
    type: bool
    default: true
  build:
    description:
      - Allow building. When false and the image of this fingerprint is missing, the task fails and says
        how to build it.
    type: bool
    default: true
  keep_previous:
    description:
      - How many older fingerprint images of O(tag) to keep besides this one (newest first); the older
        ones are removed. Each is several hundred MB and every change to the role makes a new one.
      - An image a container still uses (a box, running or stopped, or a box made from a checkpoint of
        it) is never removed, and nothing is forced. V(0) keeps only the current image.
    type: int
    default: 1
  isolation:
    description:
      - The engine the image is built on. V(userns) is the box engine, where isolated boxes run
        (C(scripts/ensure-box-engine.sh) starts it; C(AGENTBOX_ENGINE) overrides its address).
      - V(none) is the local engine as C(DOCKER_HOST) and the other C(DOCKER_*) variables say, for boxes
        created with O(agentbox.box.agentbox_box#module:isolation=none).
    type: str
    choices: [userns, none]
    default: userns
requirements:
  - docker (Python SDK) >= 7.0
  - a reachable Docker engine
  - debootstrap and root, only to make a missing Debian base image
notes:
  - In check mode it reports whether a build would happen (and whether C(:latest) would move) and builds nothing.
author:
  - agentbox.box developers (@agentbox)
extends_documentation_fragment:
  - agentbox.box.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Build the box image from the role's template (what the role does)
  agentbox.box.agentbox_image:
    dockerfile: "{{ lookup('ansible.builtin.template', 'Dockerfile.j2') }}"
    programs:
      agentbox-ctl: "{{ lookup('ansible.builtin.file', 'agentbox-ctl', rstrip=false) }}"
    base: debian:bookworm
    tag: agentbox/box
  register: box_image

- name: Build from a directory that holds a Dockerfile
  agentbox.box.agentbox_image:
    context: /tmp/agentbox-context
    tag: agentbox/box

- name: Fail unless the image of this context already exists
  agentbox.box.agentbox_image:
    context: /tmp/agentbox-context
    build: false
"""

RETURN = r"""
tag:
  description: The image's fingerprint tag.
  returned: always
  type: str
  sample: agentbox/box:3f2a9c0d41b7e6a2
latest:
  description: The moving tag that points at the same image.
  returned: always
  type: str
  sample: agentbox/box:latest
fingerprint:
  description: sha256 over the rendered Dockerfile and every file in the context.
  returned: always
  type: str
image_id:
  description: The image's id; null in check mode when it would be built.
  returned: always
  type: str
size:
  description: The image's size in bytes; null in check mode when it would be built.
  returned: always
  type: int
build_seconds:
  description: Wall time of the base step and the build; null when nothing was built.
  returned: always
  type: float
base_source:
  description: How the base image was made ready (C(present), C(pulled) or C(debootstrap)); null when nothing was built.
  returned: always
  type: str
built:
  description: Whether an image was built by this task.
  returned: always
  type: bool
would_build:
  description: Whether a build is (or in check mode would be) needed.
  returned: always
  type: bool
latest_moved:
  description: Whether C(<tag>:latest) was (or would be) moved to this image.
  returned: always
  type: bool
log:
  description: Path of the build log.
  returned: always
  type: str
removed:
  description: Tags of older fingerprint images removed (in check mode, that would be removed).
  returned: always
  type: list
  elements: str
  sample: [agentbox/box:77936677ee2506c2]
msg:
  description: One line saying what happened.
  returned: always
  type: str
"""

# Ansible modules keep their imports below the documentation strings.
import os
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._box_engine import engine_host
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._engine_sdk import engine_unreachable
from ansible_collections.agentbox.box.plugins.module_utils.providers.docker._image import (
    ImageError,
    ImageRequest,
    ensure_image,
)

try:
    import docker
    import docker.errors

    DOCKER_IMPORT_ERROR = None
except ImportError:
    DOCKER_IMPORT_ERROR = traceback.format_exc()


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "dockerfile": {"type": "str"},
            "programs": {"type": "dict", "default": {}},
            "libraries": {"type": "dict", "default": {}},
            "ca_certificates": {"type": "list", "elements": "str", "default": []},
            "context": {"type": "path"},
            "base": {"type": "str", "default": "debian:bookworm"},
            "tag": {"type": "str", "default": "agentbox/box"},
            "agents": {"type": "list", "elements": "str", "default": []},
            "vnc": {"type": "bool", "default": False},
            "build_log": {"type": "path", "default": "~/.agentbox/logs/box-image.log"},
            "force": {"type": "bool", "default": False},
            "allow_base_build": {"type": "bool", "default": True},
            "build": {"type": "bool", "default": True},
            "keep_previous": {"type": "int", "default": 1},
            "isolation": {"type": "str", "choices": ["userns", "none"], "default": "userns"},
        },
        required_one_of=[("dockerfile", "context")],
        mutually_exclusive=[("dockerfile", "context")],
        supports_check_mode=True,
    )
    for part, kind in (("ca_certificates", "certificates"), ("programs", "programs"), ("libraries", "libraries")):
        if module.params["context"] and module.params[part]:
            # Ansible's own 'mutually exclusive' says what is wrong, not what to do instead.
            module.fail_json(
                msg=f"{part} goes with dockerfile, not with context (a context directory is sent as it is): "
                f"put the {kind} in the context directory and COPY them in its Dockerfile, or give dockerfile"
            )
    if DOCKER_IMPORT_ERROR:
        module.fail_json(msg=missing_required_lib("docker"), exception=DOCKER_IMPORT_ERROR)

    request = ImageRequest(
        context=module.params["context"],
        dockerfile=module.params["dockerfile"],
        programs={str(name): str(text) for name, text in module.params["programs"].items()},
        libraries={str(path): str(text) for path, text in module.params["libraries"].items()},
        ca_certificates=module.params["ca_certificates"],
        base=module.params["base"],
        repository=module.params["tag"],
        agents=module.params["agents"],
        vnc=module.params["vnc"],
        build_log=module.params["build_log"],
        force=module.params["force"],
        allow_base_build=module.params["allow_base_build"],
        build=module.params["build"],
        keep_previous=module.params["keep_previous"],
        check_mode=module.check_mode,
    )
    docker_host = engine_host(module.params["isolation"])
    try:
        environment = {**os.environ, "DOCKER_HOST": docker_host} if module.params["isolation"] == "userns" else None
        client = docker.from_env(environment=environment)
        client.ping()
    except docker.errors.DockerException as exc:
        # The same message as every other module's: it names the socket (or DOCKER_HOST) tried.
        module.fail_json(msg=str(engine_unreachable("local", exc, docker_host)))
    try:
        result = ensure_image(client, request, docker.errors.ImageNotFound, docker.errors.APIError)
    except ImageError as exc:
        module.fail_json(msg=str(exc))
    except docker.errors.DockerException as exc:
        module.fail_json(msg=f"Docker engine error: {exc}", exception=traceback.format_exc())
    finally:
        client.close()
    outcome = result.to_dict()
    for warning in outcome.pop("warnings"):
        module.warn(warning)
    module.exit_json(**outcome)


if __name__ == "__main__":
    main()
