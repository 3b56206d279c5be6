"""The load no process on the host can see: the upstream's running requests beyond ours."""

from __future__ import annotations

import math

from test_ledger import IDLE, Run

from giul_asgi.config import Node
from giul_asgi.ledger.members import Windows
from giul_asgi.ledger.unseen import Unseen
from giul_asgi.ledger.window import Window
from giul_asgi.meter import Meter


def test_nothing_noted_is_nothing_unseen() -> None:
    assert Unseen().window_seconds(0.0, 1.0) == 0.0
    assert not Unseen().recent(1.0)


def test_the_upstream_running_only_ours_is_no_unseen_load() -> None:
    """Issue 16: the upstream's count, held between samples past our windows' close, read as
    load we could not see (10 of 10 sequential requests contended)."""
    unseen = Unseen()
    t = 0.0
    for _ in range(20):
        unseen.note_upstream(t, running=1.0, ours=1)  # mid-request: it runs ours
        t += 0.25
        unseen.note_upstream(t, running=0.0, ours=0)
        t += 0.25
    assert unseen.window_seconds(0.0, t) == 0.0 and not unseen.recent(t)


def test_requests_beyond_ours_are_unseen_window_seconds() -> None:
    unseen = Unseen()
    unseen.note_upstream(0.0, running=3.0, ours=1)
    unseen.note_upstream(1.0, running=1.0, ours=1)
    assert math.isclose(unseen.window_seconds(0.0, 1.0), 2.0)
    assert math.isclose(unseen.window_seconds(0.25, 0.5), 0.5)
    assert unseen.window_seconds(1.0, 1.5) == 0.0  # the last sample's excess is none
    assert unseen.recent(1.0) and not unseen.recent(200.0)


def test_past_the_last_sample_the_excess_holds_for_a_second_then_is_unknown() -> None:
    unseen = Unseen()
    unseen.note_upstream(0.0, running=2.0, ours=0)
    assert math.isclose(unseen.window_seconds(0.0, 0.5), 1.0)
    assert unseen.window_seconds(0.0, 1.5) == 0.0  # not covered: no claim


def test_an_upstream_sample_that_runs_fewer_than_ours_is_no_negative_load() -> None:
    unseen = Unseen()
    unseen.note_upstream(0.0, running=0.0, ours=3)  # ours still queued at the gateway
    unseen.note_upstream(1.0, running=0.0, ours=0)
    assert unseen.window_seconds(0.0, 1.0) == 0.0


def test_a_window_closed_before_the_scrape_is_not_in_the_upstreams_count() -> None:
    """A request leaves the upstream before its window closes: a window closed before the
    scrape began is none of the count, one open at any moment of the scrape may be in it."""
    windows = Windows(ramp_s=0.1)
    earlier, later = Window(0.0, 0.0, 1), Window(0.9, 0.0, 2)
    for window in (earlier, later):
        windows.enter(window)
    windows.shut(earlier, 1.0)
    assert windows.ours_at(1.02) == 1  # 20 ms after the close: only the one still open
    assert windows.ours_at(1.02, spread_s=0.03) == 2  # the scrape began before the close
    assert windows.ours_at(0.89) == 1 and windows.ours_at(0.89, spread_s=0.02) == 2


def upstream_replica_beside_ours(seed: int, gap: float) -> list[tuple[float, bool]]:
    """Ours back to back beside another replica's request on the same card; the upstream
    counts 2 while both run, 1 as ours ends, and 0 only ``gap`` later as ours starts again
    (a hostile review's shape: a count taken as ours opens)."""
    run = Run(Node("n", idle_w=IDLE, upstream="http://127.0.0.1:9/metrics"), seed=seed)
    run.advance(0.5)
    out = []
    for _ in range(12):
        theirs = run.card.start_job(180.0)
        meter = Meter(run.ledger)
        meter.open()
        job = run.card.start_job(180.0)
        run.ledger.note_upstream(run.clock.now, 2.0)
        run.advance(0.3)
        run.card.stop_job(job)
        run.card.stop_job(theirs)
        run.ledger.note_upstream(run.clock.now, 1.0)
        meter.close()
        run.advance(gap)
        run.ledger.note_upstream(run.clock.now, 0.0)
        out.append((meter, job.truth(run.card.ramp_up, run.card.tau)))
    run.advance(2.0)
    rows = []
    for meter, truth in out[2:]:
        figure = meter.figure()
        assert figure.settled and figure.joules is not None and figure.uncertainty_joules is not None
        rows.append((figure.joules / truth, abs(figure.joules - truth) <= figure.uncertainty_joules))
    return rows


def test_another_replicas_request_starting_as_ours_ends_is_not_charged_to_us() -> None:
    """Two replicas back to back on one upstream: ours counted for a ramp-down past its close
    hid the other's request, so ours took the whole card (2.01x, 0 of 100 inside)."""
    rows = [row for seed in range(5) for row in upstream_replica_beside_ours(seed, 0.02)]
    ratios = sorted(r for r, _ in rows)
    assert 0.9 < ratios[len(ratios) // 2] < 1.1, ratios
    assert sum(inside for _, inside in rows) >= 0.9 * len(rows), rows
