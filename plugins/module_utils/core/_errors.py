# Copyright (c) agentbox.box contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The errors every layer raises, at the bottom so that pure helpers and host utilities can raise
them without importing the provider interface. `_provider` re-exports them (the public path)."""

from __future__ import annotations


class ProviderError(Exception):
    """An engine or API failed. `message` says which box, which operation, and what to do."""

    def __init__(self, message: str, *, box: str | None = None, operation: str | None = None):
        self.box = box
        self.operation = operation
        prefix = ""
        if operation and box:
            prefix = f"{operation} of box {box!r} failed: "
        elif operation:
            prefix = f"{operation} failed: "
        super().__init__(prefix + message)


class EngineUnreachable(ProviderError):
    """The engine or API cannot be reached at all (daemon down, SSH refused, DNS)."""


class BoxNotFound(ProviderError):
    pass


class OutputTooLarge(ProviderError):
    """A command in the box printed more than the host agreed to read (a box may be hostile)."""


class ExecTimedOut(ProviderError):
    """A command in the box did not finish within the time the host gave it (a box may be hostile, or its
    program hung); the host stopped waiting, the command may still run in the box."""
