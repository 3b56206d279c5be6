"""The load no process on the host can see: the upstream's running requests beyond ours."""

from __future__ import annotations

import math
import random

from test_ledger import IDLE, Run
from truecard import Job

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


def test_the_held_counts_doubt_is_how_far_it_moved_at_the_samples_either_side() -> None:
    unseen = Unseen()
    for t, running in ((0.0, 1.0), (1.0, 1.0), (2.0, 0.0), (3.0, 1.0), (4.0, 1.0), (5.0, 1.0)):
        unseen.note_upstream(t, running, ours=0)
    assert unseen.doubt_seconds(0.0, 1.0) == 0.0  # held still at both samples
    assert math.isclose(unseen.doubt_seconds(1.0, 2.0), 1.0)  # it moved at the end
    assert math.isclose(unseen.doubt_seconds(2.0, 4.0), 2.0)  # at the start, then at the end
    assert math.isclose(unseen.doubt_seconds(4.0, 5.5), 0.0)  # still since, and past the last
    unseen.note_upstream(6.0, 3.0, ours=1)
    assert math.isclose(unseen.doubt_seconds(6.0, 6.5), 0.5)  # moved by one at the last


def replicas_scraped(seed: int) -> list[bool]:
    """Ours and another replica's requests back to back (0.2-0.5 s, 10-30 ms apart) on one
    upstream that counts a request 3 ms inside its window, scraped every 0.25 s at its own
    phase, the count taken within the scrape's 4 ms. Whether each settled figure of ours
    holds its truth."""
    run = Run(Node("n", idle_w=IDLE, upstream="http://127.0.0.1:9/metrics"), seed=seed)
    rng = random.Random(seed)
    run.advance(0.5)
    start = run.clock.now
    events: list[tuple[float, str, int]] = []
    engine: list[tuple[float, float]] = []
    for who in ("ours", "theirs"):
        t = start + rng.uniform(0.0, 0.3)
        for i in range(14 if who == "ours" else 40):
            seconds = rng.uniform(0.2, 0.5)
            events += [(t, who + " open", i), (t + seconds, who + " close", i)]
            engine.append((t + 0.003, t + seconds - 0.003))
            t += seconds + rng.uniform(0.01, 0.03)
    end = max(t for t, kind, _ in events if kind == "ours close")
    t = start + rng.uniform(0.0, 0.25)
    while t < end:
        events.append((t, "scrape", 0))
        t += 0.25
    events.sort()
    open_: dict[tuple[str, int], tuple[Meter | None, Job]] = {}
    done: list[tuple[Meter, Job]] = []
    for t, kind, i in events:
        if t > end:
            break
        run.advance(t - run.clock.now)
        who, _, what = kind.partition(" ")
        if kind == "scrape":
            taken = t + rng.uniform(-0.002, 0.002)
            running = sum(1 for a, b in engine if a <= taken <= b)
            run.ledger.note_upstream(t, float(running), spread_s=0.002)
        elif what == "open":
            meter = Meter(run.ledger).open() if who == "ours" else None
            open_[who, i] = (meter, run.card.start_job(180.0))
        else:
            meter, job = open_.pop((who, i))
            run.card.stop_job(job)
            if meter is not None:
                meter.close()
                done.append((meter, job))
    run.advance(2.0)
    inside = []
    for meter, job in done[2:]:
        figure, truth = meter.figure(), job.truth(run.card.ramp_up, run.card.tau)
        assert figure.settled and figure.joules is not None and figure.uncertainty_joules is not None
        inside.append(abs(figure.joules - truth) <= figure.uncertainty_joules)
    return inside


def test_another_replicas_load_between_scrapes_is_inside_the_uncertainty() -> None:
    """The count is held between scrapes: a scrape in a gap between the other replica's
    requests, or one just before its request ends, was taken as the load until the next,
    with no doubt (58 of 72 inside at eb10309); the count's moves are its doubt now (71)."""
    inside = [hit for seed in range(6) for hit in replicas_scraped(seed)]
    assert sum(inside) >= 0.9 * len(inside), (sum(inside), len(inside))
