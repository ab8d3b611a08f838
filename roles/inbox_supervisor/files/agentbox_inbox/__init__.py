# Copyright: agentbox.box developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""agentbox_inbox: the in-box supervisor of agentbox.box and its command line, `agentbox-ctl`.

The box image installs this package root-owned in /usr/local/lib/agentbox; /usr/local/bin/agentbox-ctl
is a short entry script that puts that one directory on sys.path. It needs the image's python3 and PyYAML
(Debian's python3-yaml) and nothing else.

Modules, lower ones first (each imports only those above it):
  common      constants, exit codes, the daemon's log line
  spec        agentbox.yaml as data (the specs)
  config      agentbox.yaml parsing and validation with line numbers
  units       a unit's log, process, task and service state machines, readiness probes
  wire        socket plumbing: peer checks, JSON lines, byte pipes
  supervisor  the daemon
  wizard      `agentbox-ctl init`: the set-up wizard (the collection's module_utils/project, shipped beside
              this package as agentbox_project)
  cli         the command line
"""
