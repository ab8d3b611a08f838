"""The egress tests' fixture: a gateway on its own loop, a stand-in registry on 127.0.0.1, a short HOME."""

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
def running(monkeypatch: pytest.MonkeyPatch) -> Iterator[Running]:
    home = Path(tempfile.mkdtemp(prefix="egw-", dir="/tmp"))  # short: socket paths are bounded
    monkeypatch.setenv("HOME", str(home))
    Registry.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    made = Running(home, server.server_address[1])
    yield made
    made.stop()
    server.shutdown()
    server.server_close()
    shutil.rmtree(home)


