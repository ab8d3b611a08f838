"""The egress tests' fixtures: a short HOME, a stand-in registry on 127.0.0.1, a gateway on its own loop."""

from __future__ import annotations

import http.server
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.egress.egress_support import Registry, Running


@pytest.fixture
def short_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = Path(tempfile.mkdtemp(prefix="egw-", dir="/tmp"))  # short: socket paths are bounded
    monkeypatch.setenv("HOME", str(home))
    yield home
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def registry_port() -> Iterator[int]:
    """The stand-in registry's port on 127.0.0.1."""
    Registry.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def running(short_home: Path, registry_port: int) -> Iterator[Running]:
    made = Running(short_home, registry_port)
    yield made
    made.stop()
