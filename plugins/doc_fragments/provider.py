# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Options every module that reaches boxes shares: which provider, which engine."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  provider:
    description:
      - Where the box lives.
      - V(docker) is this machine's box engine (see O(isolation)); with O(isolation=none) the local Docker
        engine (C(DOCKER_HOST) is honoured).
      - V(docker_ssh) is a Docker engine on another machine reached over SSH; set O(engine).
      - V(daytona) is a Daytona sandbox reached through the official SDK.
      - V(boxd) is a boxd microVM reached through the official SDK (gRPC).
    type: str
    choices: [docker, docker_ssh, daytona, boxd]
    default: docker
  engine:
    description:
      - The SSH destination of the Docker engine for O(provider=docker_ssh), an C(~/.ssh/config) alias or
        C(user@host[:port]).
      - Ignored by the other providers.
    type: str
  isolation:
    description:
      - How a Docker box (O(provider=docker) or V(docker_ssh)) is kept from its host.
      - V(userns) runs it on an engine that remaps user namespaces, so root in the box is an unprivileged
        uid on the host; locally that is the box engine the collection starts (C(scripts/ensure-box-engine.sh),
        C(AGENTBOX_ENGINE) overrides its address). A remote engine that does not remap is refused.
      - V(none) runs it on the engine as it is (locally the user's own, C(DOCKER_HOST) honoured), where root
        in the box holds capabilities on the host; such boxes are labelled C(io.agentbox.isolation=none).
      - Not given, a task on an existing box finds it on either local engine.
    type: str
    choices: [userns, none]
  ssh_strict_host_key_checking:
    description:
      - Check the engine's host key against C(~/.ssh/known_hosts) (O(provider=docker_ssh) only).
      - Set to V(false) only for engines you trust on a network you trust; unknown keys are then accepted.
    type: bool
    default: true
  ssh_private_key_file:
    description:
      - Private key used to reach O(engine); default the SSH agent and C(~/.ssh/config).
    type: path
  daytona_api_key:
    description:
      - API key for O(provider=daytona). Default the C(DAYTONA_API_KEY) environment variable.
    type: str
  daytona_api_url:
    description:
      - API URL for O(provider=daytona). Default C(DAYTONA_API_URL), else the SDK's default.
    type: str
  daytona_target:
    description:
      - Daytona target (region). Default C(DAYTONA_TARGET), else the SDK's default.
      - A new box is made in this region. Daytona snapshots (so checkpoints) are region-scoped; restoring a
        checkpoint into another region is refused before anything is made.
    type: str
  boxd_api_key:
    description:
      - API key for O(provider=boxd). Default C(BOXD_API_KEY); C(BOXD_TOKEN) (a token used as-is) is honoured too.
    type: str
  boxd_base_url:
    description:
      - The boxd cluster for O(provider=boxd). Default C(BOXD_BASE_URL), else production.
      - An C(http://127.0.0.1:PORT) URL reaches the local emulator (C(scripts/boxd-emulator)).
    type: str
  boxd_org:
    description:
      - The boxd org whose machines the boxes are. Default C(BOXD_ORG), else the caller's own.
    type: str
"""
