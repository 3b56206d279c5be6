from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT / "benchmarks"))  # truecard: the card that knows the truth
# Processes share cards by default through a per-user place on the host: each test session
# gets a place of its own, so two sessions (and fakes with the same UUIDs) never meet. Tests
# of the default itself take this setting away from the processes they start.
os.environ["GIUL_ASGI_LOAD_DIR"] = tempfile.mkdtemp(prefix="giul-asgi-tests-")

from fake_nvml import FakeGpu, FakeNvml  # noqa: E402

from giul_asgi import Ledgers  # noqa: E402

T = TypeVar("T")


@pytest.fixture
def fake_nvml() -> FakeNvml:
    return FakeNvml([FakeGpu()])


@pytest.fixture
def ledgers() -> Ledgers:
    return Ledgers()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def closing() -> Iterator[Callable[[T], T]]:
    """``closing(client)`` closes ``client`` when the test ends, however it ends: a client
    left to the garbage collector keeps its connection open, and the ResourceWarning fails
    whichever test runs when it is collected."""
    with contextlib.ExitStack() as stack:
        yield stack.enter_context
