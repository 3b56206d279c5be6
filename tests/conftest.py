from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT / "benchmarks"))  # truecard: the card that knows the truth

from fake_nvml import FakeGpu, FakeNvml  # noqa: E402

from giul_asgi import Ledgers  # noqa: E402


@pytest.fixture
def fake_nvml() -> FakeNvml:
    return FakeNvml([FakeGpu()])


@pytest.fixture
def ledgers() -> Ledgers:
    return Ledgers()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
