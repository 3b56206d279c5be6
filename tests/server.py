"""A real uvicorn server on 127.0.0.1, in a thread, for end-to-end tests."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports of 127.0.0.1: every socket is held until all are chosen (one
    bound and closed at a time, the kernel handed the same port twice: two servers of a test
    became one, on a loaded machine)."""
    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.socket()) for _ in range(n)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]


def free_port() -> int:
    """A free port of 127.0.0.1, for a server a test starts in another process."""
    return free_ports(1)[0]


@contextlib.contextmanager
def serve(app: Any, **config: Any) -> Iterator[str]:
    """Serve ``app`` on a free port of 127.0.0.1; yield its base URL; stop it cleanly."""
    with run(uvicorn.Server(uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", **config
    ))) as url:
        yield url


@contextlib.contextmanager
def run(server: uvicorn.Server) -> Iterator[str]:
    """Run a configured uvicorn ``server`` (port 0: a free one) in a thread; yield its URL."""
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
