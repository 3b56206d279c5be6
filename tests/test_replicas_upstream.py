"""Two gateway replicas in front of one inference server charge its card once: each reads the
server's own running requests (a real local /metrics endpoint in vLLM's names) beside the card,
and shares each span by its part of that whole load. No state passes between the replicas."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from truecard import TrueCard, TrueReader

from giul_asgi import ConfigError, load_config
from giul_asgi.config import Node
from giul_asgi.ledger import Ledger
from giul_asgi.meter import Meter

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
from metrics_server import Served, serving

IDLE = 70.0


def metrics(running: int) -> str:
    return (
        "# HELP vllm:num_requests_running Number of requests currently running on GPU.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{model_name="m"}} {running}\n'
    )


def run_replicas(upstream: bool) -> tuple[float, float]:
    card = TrueCard(idle_w=IDLE, seed=3)
    served = Served(metrics(0))
    lock = threading.Lock()
    running = 0
    with serving(served):
        url = served.url + "/metrics" if upstream else None
        replicas = [
            Ledger(Node(f"card-{i}", idle_w=IDLE, upstream=url), TrueReader(card)) for i in range(2)
        ]
        for ledger in replicas:
            ledger.ensure_started()
        time.sleep(0.6)  # each replica has read the card and the server a few times

        def one(ledger: Ledger, delay: float, seconds: float, out: list[tuple[Meter, float]]) -> None:
            nonlocal running
            time.sleep(delay)
            meter = Meter(ledger)
            meter.open()
            job = card.start_job(150.0)
            with lock:
                running += 1
                served.text = metrics(running)
            time.sleep(seconds)
            card.stop_job(job)
            with lock:
                running -= 1
                served.text = metrics(running)
            meter.close()
            out.append((meter, job.truth(card.ramp_up, card.tau)))

        out: list[tuple[Meter, float]] = []
        plan = [(0, 0.0, 1.2), (1, 0.0, 1.2), (0, 1.6, 1.0), (1, 1.9, 1.0), (1, 3.2, 0.8), (0, 3.3, 1.2)]
        threads = [threading.Thread(target=one, args=(replicas[i], d, s, out)) for i, d, s in plan]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        deadline = time.monotonic() + 3.0
        while not all(m.settled_now for m, _ in out) and time.monotonic() < deadline:
            time.sleep(0.05)
        for ledger in replicas:
            ledger.stop()
    charged = sum(m.figure().joules or 0.0 for m, _ in out)
    return charged, sum(truth for _, truth in out)


def test_two_replicas_reading_the_upstreams_load_charge_the_card_once() -> None:
    charged, caused = run_replicas(upstream=True)
    assert abs(charged / caused - 1.0) < 0.2, (charged, caused)


def test_without_the_upstreams_load_each_replica_takes_the_whole_card() -> None:
    charged, caused = run_replicas(upstream=False)
    assert charged / caused > 1.4, (charged, caused)


def test_an_upstream_that_cannot_be_read_is_said_in_the_log_the_books_and_each_figure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stranger's trial: a wrong path, a server down or a bad certificate left the upstream
    unread with nothing said anywhere, while two replicas each charged the whole card."""
    card = TrueCard(idle_w=IDLE, seed=4)
    served = Served("not found", status=404)
    with serving(served), caplog.at_level(logging.INFO, logger="giul_asgi"):
        ledger = Ledger(Node("card", idle_w=IDLE, upstream=served.url + "/metrics"), TrueReader(card))
        ledger.ensure_started()
        try:
            assert until(lambda: ledger.totals().upstream_error is not None), "never said"
            assert "HTTP 404" in (ledger.totals().upstream_error or "")
            meter = Meter(ledger)
            meter.open()
            time.sleep(0.05)
            meter.close()
            assert "the upstream's metrics cannot be read" in (meter.figure().error or "")
            served.status, served.text = 200, metrics(0)
            assert until(lambda: ledger.totals().upstream_error is None), "never cleared"
        finally:
            ledger.stop()
    said = [r for r in caplog.records if "upstream's metrics" in r.getMessage()]
    assert [r.levelname for r in said] == ["WARNING", "INFO"], said  # once each, however long
    assert "giul-asgi probe --upstream" in said[0].getMessage()


def until(ok: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_node_counts_only_its_models_requests_where_the_server_runs_others_elsewhere() -> None:
    """A stranger's trial: a server running a second model on its other card had that
    model's requests booked as foreign on this card (0.55x, every figure contended)."""
    card = TrueCard(idle_w=IDLE, seed=6)
    served = Served(
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="ours"} 0\n'
        'vllm:num_requests_running{model_name="elsewhere"} 3\n'
    )
    with serving(served):
        node = Node("card", idle_w=IDLE, upstream=served.url + "/metrics", upstream_model="ours")
        ledger = Ledger(node, TrueReader(card))
        ledger.ensure_started()
        try:
            assert until(lambda: served.hits >= 3), "never scraped"
            assert not ledger.book.decider.unseen.recent(None), "the other model's load was counted"
        finally:
            ledger.stop()
    assert load_config({"node": [{"name": "n", "upstream": "http://h/metrics",
                                  "upstream_model": "ours"}]}).nodes[0].upstream_model == "ours"
    with pytest.raises(ConfigError, match="no upstream is given"):
        Node("n", upstream_model="ours")
