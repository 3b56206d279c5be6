"""Rolling statistics: windows, quantiles, unknowns never as zeros, bounded memory, merging."""

from __future__ import annotations

import bisect
import math
import random
import threading
from pathlib import Path

import pytest

from giul_asgi.energy import Energy
from giul_asgi.errors import ConfigError
from giul_asgi.listeners import Listener, Listeners, Settled
from giul_asgi.stats import (
    JOULE_BUCKETS,
    OTHER,
    EnergyStats,
    HostStats,
    key_bound,
    parse_window,
    status_class,
)
from giul_asgi.stats.sketch import BINS, HIGHEST


class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def energy(joules: float | None, *, route: str = "/v1/chat", node: str = "gpu0", tier: str = "8b",
           method: str = "measured", tokens: int | None = 10, seconds: float = 0.5,
           contended: bool | None = False) -> Energy:
    return Energy(joules, method, node=node, tier=tier, route=route,  # type: ignore[arg-type]
                  seconds=seconds, tokens=tokens, contended=contended)


def test_a_window_keeps_recent_requests_and_all_keeps_everything() -> None:
    clock = Clock()
    stats = EnergyStats(clock=clock)
    stats.record(energy(100.0), outcome="ok", status=200)
    clock.t += 120  # two minutes later: out of 1m, inside 15m
    stats.record(energy(10.0), outcome="ok", status=200)
    one = stats.snapshot("1m")["totals"]
    assert one["requests"] == 1 and one["joules"]["sum"] == 10.0
    assert stats.snapshot("15m")["totals"]["joules"]["sum"] == 110.0
    clock.t += 3 * 3600
    assert stats.snapshot("1h")["totals"]["requests"] == 0
    assert stats.snapshot("all")["totals"]["joules"]["sum"] == 110.0


def test_an_unknown_figure_counts_as_a_request_never_as_zero_joules() -> None:
    stats = EnergyStats(clock=Clock())
    stats.record(energy(50.0), outcome="ok", status=200)
    for bad in (None, 0.0, -3.0, math.nan, math.inf):
        stats.record(energy(bad, method="unknown"), outcome="ok", status=200)
    total = stats.snapshot("all")["totals"]
    assert total["requests"] == 6
    assert total["joules"] == {"known": 1, "sum": 50.0, "mean": 50.0, "p50": pytest.approx(50.0, rel=0.01),
                               "p90": pytest.approx(50.0, rel=0.01), "p99": pytest.approx(50.0, rel=0.01)}
    assert total["methods"]["unknown"] == 5
    assert total["method_shares"]["unknown"] == pytest.approx(5 / 6, rel=1e-4)
    nothing = EnergyStats(clock=Clock())
    nothing.record(energy(None, method="unknown"), outcome="ok", status=200)
    j = nothing.snapshot("all")["totals"]["joules"]
    assert j["sum"] is None and j["mean"] is None and j["p50"] is None  # absent, not 0


def test_quantiles_are_within_the_sketch_accuracy_of_the_exact_ones() -> None:
    stats = EnergyStats(clock=Clock())
    rng = random.Random(7)
    values = [rng.lognormvariate(3, 1.2) for _ in range(5000)]
    for v in values:
        stats.record(energy(v), outcome="ok", status=200)
    values.sort()
    j = stats.snapshot("all")["routes"]["/v1/chat"]["joules"]
    for q in ("p50", "p90", "p99"):
        exact = values[round(int(q[1:]) / 100 * (len(values) - 1))]
        assert j[q] == pytest.approx(exact, rel=0.021)
    assert j["sum"] == pytest.approx(sum(values), rel=1e-5)


def test_joules_per_token_tokens_per_joule_and_seconds() -> None:
    stats = EnergyStats(clock=Clock())
    stats.record(energy(10.0, tokens=10, seconds=1.0), outcome="ok", status=200)  # 1 J/token
    stats.record(energy(30.0, tokens=10, seconds=3.0), outcome="ok", status=200)  # 3 J/token
    stats.record(energy(99.0, tokens=None), outcome="ok", status=200)  # no tokens: not in J/token
    s = stats.snapshot("all")["tiers"]["8b"]
    assert s["joules_per_token"]["aggregate"] == pytest.approx(2.0)
    assert s["tokens_per_joule"]["aggregate"] == pytest.approx(0.5)
    assert s["joules_per_token"]["p50"] in (pytest.approx(1.0, rel=0.02), pytest.approx(3.0, rel=0.02))
    assert s["tokens"] == 20 and s["seconds"]["sum"] == pytest.approx(4.5)


def test_outcomes_status_classes_and_the_method_mix() -> None:
    stats = EnergyStats(clock=Clock())
    stats.record(energy(1.0), outcome="ok", status=200)
    stats.record(energy(1.0, contended=True), outcome="error", status=500)
    stats.record(energy(2.0, method="estimated"), outcome="disconnect", status=None)
    stats.record(energy(2.0, method="simulated"), outcome="nonsense", status=99)
    s = stats.snapshot("all")["totals"]
    assert s["outcomes"] == {"ok": 1, "error": 1, "disconnect": 1, "cancelled": 0, "incomplete": 1}
    assert s["statuses"] == {"2xx": 1, "5xx": 1, "none": 2}
    assert s["methods"] == {"measured": 2, "estimated": 1, "simulated": 1, "unknown": 0}
    assert s["method_shares"]["contended"] == 0.25
    assert status_class(404) == "4xx" and status_class(None) == "none" and status_class(700) == "none"


def test_groups_are_bounded_and_overflow_counts_under_other() -> None:
    stats = EnergyStats(clock=Clock(), max_labels=3)
    for i in range(10):
        stats.record(energy(1.0, route=f"/r{i}"), outcome="ok", status=200)
    routes = stats.snapshot("all")["routes"]
    assert len(routes) == 3 and routes[OTHER]["requests"] == 8
    assert {k[0] for k, *_ in stats.counters()} == {"/r0", "/r1", OTHER}


def feed(stats: EnergyStats, clock: Clock, n: int, span_s: float, *, keys: int = 200,
         batch: int = 20, seed: int = 1) -> None:
    """``n`` records over ``keys`` label keys and ``span_s`` seconds, in reader-thread batches."""
    rng = random.Random(seed)
    figures = [energy(rng.lognormvariate(3, 1.2) if i % 20 else None, route=f"/r{i % 50}",
                      node=f"gpu{i % keys // 50}", tier=f"t{i % keys // 50}",
                      tokens=rng.randint(1, 800), seconds=rng.uniform(0.05, 3))
               for i in range(997)]
    dt = span_s / n * batch
    for i in range(0, n, batch):
        clock.t += dt
        stats.settled([Settled(figures[(i + k) % 997], "ok", 200) for k in range(batch)])


def test_memory_is_bounded_by_keys_slots_and_bins_not_by_requests() -> None:
    clock = Clock()
    stats = EnergyStats(clock=clock)
    bound = stats.bound()
    per_key = stats.geometry.slots_per_key()
    # current + pending (two of the widest slot: 2 x 12 steps) + rings + base + start
    assert per_key == 1 + 24 + 6 + 30 + 30 + 2 and bound["most_bins_a_cell"] == 3 * BINS
    sizes = []
    for n in (100_000, 1_000_000):
        feed(stats, clock, n, 5000.0)  # 83 min each time: every ring full
        stats.snapshot("15m")
        size = stats.size()
        sizes.append(size)
        assert size["keys"] == 200
        for name, most in bound.items():
            assert size[name] <= most, (n, name, size[name], most)
        # The rings are full: the bound is reached, but for the pending steps (folded at
        # this read) and each ring's open slot, which exists once a step in it has ended.
        assert size["most_cells_a_key"] >= per_key - 24 - 3
        assert size["cells"] <= size["keys"] * per_key
        assert size["bins"] <= size["cells"] * 3 * BINS
    # Ten times the records, the same cells (but for the rings' open slots).
    assert abs(sizes[1]["cells"] - sizes[0]["cells"]) <= 200 * 3
    assert stats.snapshot("all")["totals"]["requests"] == 1_100_000
    assert sum(len(v) for v in stats._nodes.samples.values()) == 0


def test_hostile_labels_stay_within_the_key_bound() -> None:
    stats = EnergyStats(clock=Clock(), max_labels=8, max_keys=20)
    for i in range(3000):
        stats.record(energy(1.0, route=f"/r{i}", node=f"n{i % 97}", tier=f"t{i % 13}",
                            method=("measured", "bogus")[i % 2]),
                     outcome=("ok", "error", "weird")[i % 3], status=(200, 404, 503, 42)[i % 4])
    size, bound = stats.size(), stats.bound()
    assert bound["keys"] == key_bound(20) == 20 + 4 * 5 * 6
    for name in ("keys", "raw_labels", "cells"):
        assert size[name] <= bound[name], name
    snap = stats.snapshot("all")
    assert snap["totals"]["requests"] == 3000 and stats.dropped == 0
    for group in ("routes", "nodes", "tiers"):
        assert len(snap[group]) <= 8 and OTHER in snap[group]
    assert set(snap["methods"]) <= {"measured", "unknown"}
    assert snap["totals"]["outcomes"]["incomplete"] == 1000


def test_record_never_raises_and_counts_what_it_could_not_use() -> None:
    stats = EnergyStats(clock=Clock())
    stats.record(object(), outcome="ok", status=200)  # type: ignore[arg-type]
    assert stats.dropped == 1 and stats.snapshot("all")["totals"]["requests"] == 0


def test_recording_from_threads_loses_nothing() -> None:
    stats = EnergyStats()

    def work() -> None:
        for _ in range(2000):
            stats.record(energy(1.0), outcome="ok", status=200)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert stats.snapshot("all")["totals"]["joules"]["sum"] == 8000.0


def test_merged_states_equal_one_statistics_fed_everything() -> None:
    clock = Clock()
    one, a, b = (EnergyStats(clock=clock) for _ in range(3))
    rng = random.Random(3)
    for i in range(600):
        clock.t += 7.0
        e = energy(rng.uniform(1, 100), route=f"/r{i % 4}", node=f"gpu{i % 2}", tokens=1 + i % 9)
        one.record(e, outcome="ok", status=200)
        (a if i % 3 else b).record(e, outcome="ok", status=200)
    merged = a.empty_like()
    merged.merge_state(a.state())
    merged.merge_state(b.state())
    for window in ("1m", "15m", "1h", "all"):
        want, got = one.snapshot(window), merged.snapshot(window)
        for key in ("totals", "routes", "nodes", "tiers", "methods"):
            assert _round(got[key]) == _round(want[key]), (window, key)
    assert _round([list(c) for c in sorted(merged.counters())]) == _round(
        [list(c) for c in sorted(one.counters())])


def test_a_state_of_another_configuration_is_refused() -> None:
    state = EnergyStats(step_s=5).state()
    with pytest.raises(ConfigError, match="another configuration"):
        EnergyStats().merge_state(state)


def test_configuration_is_checked() -> None:
    assert parse_window("90s") == 90 and parse_window("1h") == 3600 and parse_window("all") is None
    for bad in ("", "15", "m", "-1m", "0s", "1y"):
        with pytest.raises(ConfigError, match="not a duration"):
            parse_window(bad)
    with pytest.raises(ConfigError):
        EnergyStats(windows=())
    with pytest.raises(ConfigError):
        EnergyStats(step_s=0)
    with pytest.raises(ConfigError, match="unknown window"):
        EnergyStats().snapshot("2h")
    custom = EnergyStats(windows=("30s", "all"), clock=Clock())
    custom.record(energy(5.0), outcome="ok", status=200)
    assert custom.snapshot()["window"] == "30s" and custom.snapshot("30s")["totals"]["requests"] == 1


def test_node_samples_give_power_and_series() -> None:
    clock = Clock()
    stats = EnergyStats(clock=clock)

    class T:
        node, measured_j, charged_j, unattributed_j, reads = "gpu0", 0.0, 0.0, 0.0, 0

    t = T()
    for _ in range(5):
        stats.observe_nodes([t])
        clock.t += 10
        t.measured_j += 1000.0
        t.charged_j += 800.0
        t.unattributed_j += 200.0
        t.reads += 100
    stats.observe_nodes([t])
    assert stats.node_rates()["gpu0"] == (100.0, 10.0)
    power = stats.snapshot("15m")["series"]["power"]["gpu0"]
    assert power["measured_w"][-1] == 100.0 and power["charged_w"][-1] == 80.0
    assert power["unattributed_w"][-1] == 20.0


def _round(obj: object) -> object:
    if isinstance(obj, float):
        return float(f"{obj:.4g}")
    if isinstance(obj, dict):
        return {k: _round(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_round(v) for v in obj]
    return obj


def test_windows_and_groups_agree_with_a_direct_count_whenever_they_are_read() -> None:
    """Reads at random moments (and long stretches with none, when the reader thread folds)
    give what counting the records in each window directly gives."""
    rng = random.Random(11)
    clock = Clock()
    stats = EnergyStats(clock=clock)
    seen: list[tuple[int, str, int]] = []  # (step, route, nanojoules)
    folded_unread = 0
    for i in range(3000):
        silent = (i // 1000) % 2 == 1  # no reader for a while: the recording thread folds
        clock.t += rng.choice((0.5, 3.0, 9.0, 40.0, 400.0)) if not silent else 10.0
        batch = []
        for _ in range(rng.randint(1, 6)):
            route, joules = f"/r{rng.randrange(5) if not silent else 0}", rng.uniform(0.5, 50.0)
            node = f"gpu{rng.randrange(2) if not silent else 0}"
            batch.append(Settled(energy(joules, route=route, node=node), "ok", 200))
            seen.append((int(clock.t // 10), route, round(joules * 1e9)))
        stats.settled(batch)
        if not silent and rng.random() < 0.2:
            folded_unread += any(r.dirty for r in stats._keys.values())
            window = rng.choice(("1m", "15m", "1h", "all"))
            snap = stats.snapshot(window)
            now = int(clock.t // 10)
            index = stats.geometry.ring_of[window]
            if index is None:
                inside = seen
            else:
                width, n = stats.geometry.rings[index]
                inside = [r for r in seen if r[0] // width >= now // width - n + 1]
            assert snap["totals"]["requests"] == len(inside), window
            want = sum(r[2] for r in inside) / 1e9
            assert snap["totals"]["joules"]["sum"] == pytest.approx(want, rel=1e-5)  # 6 digits
            for route, row in snap["routes"].items():
                assert row["requests"] == sum(1 for r in inside if r[1] == route), (window, route)
    assert folded_unread

def test_a_bad_record_in_a_batch_costs_only_itself() -> None:
    stats = EnergyStats(clock=Clock())
    good = energy(2.0)
    stats.settled([
        Settled(good, "ok", 200),
        Settled("not a figure", "ok", 200),  # type: ignore[arg-type]
        Settled(energy("12"), "ok", 200),  # type: ignore[arg-type]
        Settled(energy(3.0, seconds=None), "ok", 200),  # type: ignore[arg-type]
        Settled(energy(4.0, tokens="5", contended=None), "ok", "200"),  # type: ignore[arg-type]
        Settled(good, "ok", 200),
    ])
    total = stats.snapshot("all")["totals"]
    assert stats.dropped == 3 and total["requests"] == 3
    assert total["joules"]["sum"] == 8.0 and total["tokens"] == 20  # "5" tokens are no tokens
    assert total["statuses"] == {"2xx": 2, "none": 1}


def test_prometheus_buckets_are_exact_at_their_edges_and_the_range_is_clamped() -> None:
    stats = EnergyStats(clock=Clock())
    rng = random.Random(4)
    values = [rng.lognormvariate(1, 3) for _ in range(3000)]
    for edge in JOULE_BUCKETS:
        values += [edge * (1 - 1e-9), edge * (1 + 1e-9)]
    values += [0.01, 0.1, 1.0, 10.0, 100.0, 1000.0, 1e4, 1e5, 1e-30, 1e14]  # 1e15 J: no request's
    stats.settled([Settled(energy(v), "ok", 200) for v in values])
    ((_, n, known, joules, _, buckets),) = stats.counters()
    want = [0] * (len(JOULE_BUCKETS) + 1)
    for v in values:
        want[bisect.bisect_left(JOULE_BUCKETS, v)] += 1
    assert buckets == want and n == known == len(values)
    assert joules == pytest.approx(math.fsum(values), rel=1e-12)
    j = stats.snapshot("all")["totals"]["joules"]
    assert j["p99"] <= HIGHEST * 1.01  # beyond the range reads as its edge


def test_since_start_counters_never_go_backwards_and_stay_exact() -> None:
    clock = Clock()
    stats = EnergyStats(clock=clock)
    rng = random.Random(8)
    last: dict[tuple[str, ...], tuple[int, float]] = {}
    exact = 0
    for i in range(3000):
        clock.t += rng.uniform(0, 12)  # 5 hours: slots leave every ring into base
        joules = rng.uniform(0.1, 99.9)
        exact += round(joules * 1e9)
        stats.record(energy(joules, route=f"/r{i % 3}"), outcome=("ok", "error")[i % 2], status=200)
        if i % 37 == 0:
            for key, n, _, j, _, _ in stats.counters():
                before = last.get(key, (0, 0.0))
                assert n >= before[0] and j >= before[1], key
                last[key] = (n, j)
            if i % 3 == 0:
                stats.snapshot(rng.choice(("15m", "all")))
    assert sum(c[3] for c in stats.counters()) == pytest.approx(exact / 1e9, rel=1e-15)


def test_a_clock_that_steps_back_counts_in_the_latest_slot() -> None:
    clock = Clock()
    stats = EnergyStats(clock=clock)
    stats.record(energy(1.0), outcome="ok", status=200)
    clock.t -= 3600.0  # NTP stepped the clock back an hour
    stats.record(energy(2.0), outcome="ok", status=200)
    assert stats.snapshot("1m")["totals"]["joules"]["sum"] == 3.0


def test_a_worker_state_with_a_bad_row_changes_nothing() -> None:
    clock = Clock()
    mine, theirs = EnergyStats(clock=clock), EnergyStats(clock=clock)
    mine.record(energy(1.0), outcome="ok", status=200)
    theirs.record(energy(2.0), outcome="ok", status=200)
    state = theirs.state()
    row = ["/r", "n", "t", "measured", "ok", "9xx", *state["keys"][0][6:]]  # no such status class
    bad = {**state, "keys": [*state["keys"], row]}
    with pytest.raises(ValueError):
        mine.merge_state(bad)
    assert mine.snapshot("all")["totals"]["requests"] == 1
    mine.merge_state(state)
    assert mine.snapshot("all")["totals"]["joules"]["sum"] == 3.0


def test_the_statistics_are_a_listener_of_settled_figures(tmp_path: Path) -> None:
    stats = EnergyStats(clock=Clock())
    host = HostStats(EnergyStats(clock=Clock()), tmp_path, flush_s=60)
    try:
        listeners = Listeners([stats, host])
        assert all(isinstance(x, Listener) for x in listeners)
        listeners.settled([Settled(energy(5.0), "ok", 200),
                           Settled(energy(None, method="unknown"), "error", 500)])
        for s in (stats, host):
            total = s.snapshot("all")["totals"]
            assert total["requests"] == 2 and total["joules"]["sum"] == 5.0
            assert total["outcomes"]["error"] == 1
    finally:
        host.close()


def test_recording_on_one_thread_while_another_reads_loses_nothing() -> None:
    clock = Clock()
    stats = EnergyStats(clock=clock)
    done = threading.Event()
    errors: list[BaseException] = []

    def read() -> None:
        try:
            while not done.is_set():
                stats.snapshot("15m")
                stats.counters()
                stats.snapshot("all")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(4000):
            clock.t += 0.7
            stats.settled([Settled(energy(1.0, route=f"/r{i % 7}"), "ok", 200)] * 3)
    finally:
        done.set()
        reader.join()
    assert not errors
    assert stats.snapshot("all")["totals"]["joules"]["sum"] == 12000.0
    assert sum(c[1] for c in stats.counters()) == 12000


def test_since_start_alone_counts_every_step() -> None:
    clock = Clock()
    stats = EnergyStats(windows=("all",), clock=clock)
    for _ in range(30):
        clock.t += 7.0  # steps go by: nothing rolls, everything stays
        stats.record(energy(2.0), outcome="ok", status=200)
    snap = stats.snapshot()
    assert snap["window"] == "all" and snap["totals"]["requests"] == 30
    assert snap["totals"]["joules"]["sum"] == 60.0 and sum(c[1] for c in stats.counters()) == 30
