from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fake_nvml import FakeGpu, FakeNvml

from giul_asgi import Ledger, Ledgers, Node
from giul_asgi.readers import SimulatedCard, SimulatedReader, VirtualClock


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def card(clock: VirtualClock) -> SimulatedCard:
    return SimulatedCard(idle_w=60.0, cap_w=700.0, counter_period=0.1, clock=clock)


@pytest.fixture
def sim_ledger(card: SimulatedCard) -> Ledger:
    ledger = Ledger(Node("sim", idle_w=60.0), SimulatedReader(card))
    warm_up(ledger, card.clock)  # type: ignore[arg-type]
    return ledger


def warm_up(ledger: Ledger, clock: VirtualClock, seconds: float = 2.0) -> None:
    """Idle reads at jittered times, as the ledger's task makes, so the step phase is known."""
    jitter = random.Random(3)
    ledger.read_now()
    end = clock() + seconds
    while clock() < end:
        clock.advance(ledger.poll_s * jitter.uniform(0.6, 1.4))
        ledger.read_now()


@pytest.fixture
def fake_nvml() -> FakeNvml:
    return FakeNvml([FakeGpu()])


@pytest.fixture
def ledgers() -> Ledgers:
    return Ledgers()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"

