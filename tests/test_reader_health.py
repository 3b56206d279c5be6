"""A node's reader health where operators look: /energy's node section and Prometheus.

A reader that fails is visible as state ``failing`` with its last error and remedy, and as
``giul_node_reader_up 0``; one that reads as ``ok`` and 1. Real threads, waits bounded
generously on conditions.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Literal

from giul_asgi.config import Node
from giul_asgi.exporters.prometheus import EnergyCollector, prometheus_text, reader_families
from giul_asgi.ledger import Ledger
from giul_asgi.readers.base import Kind, Reading
from giul_asgi.serve.endpoint import EnergyEndpoint
from giul_asgi.stats import EnergyStats

WAIT_S = 20.0


class Card:
    backend = "test_card"
    source = "local"
    method: Literal["measured", "simulated"] = "measured"
    kind: Kind = "counter"
    period = 0.05
    remedy = "reconnect the test card"

    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.clock = time.monotonic
        self.joules = 100.0

    def read(self) -> Reading:
        self.joules += 1.0
        if self.fail:
            return Reading(t=self.clock(), error="the test card went away")
        return Reading(t=self.clock(), joules=self.joules)

    def close(self) -> None:
        return None


def _until(predicate: Callable[[], bool]) -> bool:
    end = time.monotonic() + WAIT_S
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_a_failing_and_a_working_reader_as_energy_and_prometheus_show_them() -> None:
    bad = Ledger(Node("bad", reader="none", idle_w=10.0), Card(fail=True))
    good = Ledger(Node("good", reader="none", idle_w=10.0), Card(fail=False))
    assert next(iter(reader_families([bad, good]))).samples == []  # not started: nothing to say yet
    for ledger in (bad, good):
        ledger.ensure_started()
    try:
        assert _until(lambda: bad.health is not None and bad.health.errors >= 2)
        assert _until(lambda: good.health is not None and good.health.state == "ok")
        endpoint = EnergyEndpoint(stats=EnergyStats(), ledgers=[bad, good])
        nodes = endpoint.snapshot()["nodes"]
        failing = nodes["bad"]["ledger"]["reader"]
        assert failing["state"] == "failing" and failing["last_error"] == "the test card went away"
        assert failing["remedy"] == "reconnect the test card" and failing["reader"] == "test_card"
        assert nodes["good"]["ledger"]["reader"]["state"] == "ok"
        assert nodes["bad"]["ledger"]["read_errors"] >= 2
        text = prometheus_text(EnergyCollector(EnergyStats(), [bad, good])).decode()
        assert 'giul_node_reader_up{node="bad",reader="test_card"} 0.0' in text
        assert 'giul_node_reader_up{node="good",reader="test_card"} 1.0' in text
        # In-process cards: each worker's books are its own series (process="<pid>").
        assert f'giul_node_last_reading_age_seconds{{node="good",process="{os.getpid()}"}}' in text
        assert f'giul_node_reader_errors_total{{node="bad",process="{os.getpid()}"}}' in text
    finally:
        bad.stop(WAIT_S)
        good.stop(WAIT_S)


def test_a_broken_ledger_list_never_breaks_a_scrape() -> None:
    class Broken:
        def __iter__(self) -> object:
            raise RuntimeError("boom")

    families = list(reader_families(Broken()))  # type: ignore[arg-type]
    assert families[0].name == "giul_node_reader_up" and families[0].samples == []
