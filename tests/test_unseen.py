"""The load no process on the host can see: the upstream's running requests beyond ours."""

from __future__ import annotations

import math

import pytest
from test_ledger import IDLE, Run
from upstream_replicas import LONG, one

from giul_asgi.config import Node
from giul_asgi.ledger.members import Windows
from giul_asgi.ledger.unseen import Unseen, most_at_once
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


def test_an_upstreams_count_surely_has_the_windows_open_all_through_its_scrape() -> None:
    """A request leaves the upstream before its window closes: a window closed before the
    scrape (and the count's lag) is none of its count; one open all through it surely is;
    one that began or ended in it may be."""
    windows = Windows(ramp_s=0.1)
    earlier, later = Window(0.0, 0.0, 1), Window(0.9, 0.0, 2)
    for window in (earlier, later):
        windows.enter(window)
    windows.shut(earlier, 1.0)
    assert windows.ours_at(1.02) == (1, [])  # 20 ms after the close: only the one still open
    surely, maybe = windows.ours_at(1.02, spread_s=0.03)  # the scrape began before the close
    assert surely == 1 and maybe == [pytest.approx((0.99, 1.0))]
    surely, maybe = windows.ours_at(1.02, lag_s=0.1)  # a count 0.1 s stale may still have it
    assert surely == 1 and maybe == [pytest.approx((0.92, 1.0))]
    assert windows.ours_at(0.89) == (1, [])
    assert windows.ours_at(0.89, spread_s=0.02)[1] == [pytest.approx((0.9, 0.91))]
    assert windows.ours_at(1.2, lag_s=0.1) == (1, [])


def test_a_count_taken_at_one_instant_has_at_most_the_windows_open_together() -> None:
    """Short requests back to back touch a scrape's time three at a time, and are in its
    count one at a time: each counted as maybe in it hid another replica's request whole
    (1.9-2.1x, a hostile review)."""
    assert most_at_once([]) == 0 and most_at_once([(0.0, 1.0)]) == 1
    assert most_at_once([(0.0, 0.03), (0.035, 0.07), (0.075, 0.1)]) == 1
    assert most_at_once([(0.0, 0.05), (0.05, 0.1)]) == 2  # touching: both, for a moment
    assert most_at_once([(0.0, 0.1), (0.02, 0.03), (0.05, 0.08), (0.06, 0.07)]) == 3


def test_a_count_that_may_have_ours_in_it_keeps_the_excess_it_had() -> None:
    """Our window that just ended may still be in a count that lags its end (a gauge updated
    every few steps): it read as another's load, every figure contended (hostile: 50-100% of
    them with our load alone). Another's request that began as ours ended keeps its excess."""
    unseen = Unseen()
    unseen.note_upstream(0.0, running=1.0, ours=1)
    unseen.note_upstream(0.25, running=1.0, ours=0, maybe=1)  # ours ended just before
    assert unseen.window_seconds(0.0, 0.5) == 0.0 and not unseen.recent(0.5)
    unseen.note_upstream(0.5, running=2.0, ours=1)  # another's, surely
    unseen.note_upstream(0.75, running=2.0, ours=0, maybe=2)  # ours ended, ours began: it holds
    assert math.isclose(unseen.window_seconds(0.5, 1.0), 0.5)
    unseen.note_upstream(1.0, running=4.0, ours=0, maybe=1)  # at least three beyond ours
    assert math.isclose(unseen.window_seconds(1.0, 1.5), 1.5)


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


def test_a_scrape_that_cannot_tell_ours_from_another_replicas_is_doubted() -> None:
    """Two replicas back to back on one upstream, scraped only as ours opens and 20 ms after
    ours ends: whether the count has our last request (a count that lags) or the other's new
    one, no scrape can tell. Ours took the whole card with no doubt (2.01x, 0 of 100 inside);
    it still takes it, and says how far it may be off."""
    rows = [row for seed in range(5) for row in upstream_replica_beside_ours(seed, 0.02)]
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


def replicas_scraped(seed: int, ours_apart: float = 0.02, theirs: bool = True, lag_s: float = 0.0,
                     ours_s: tuple[float, float] = LONG) -> list[tuple[bool, bool]]:
    """benchmarks/upstream_replicas.py's shapes: ours (``ours_s`` long, ``ours_apart`` +- half
    of it apart) and, where ``theirs``, another replica's requests back to back (0.2-0.5 s,
    10-30 ms apart) on one upstream that counts a request 3 ms inside its window (as it stood
    ``lag_s`` before), scraped every 0.25 s at its own phase. Whether each settled figure of
    ours holds its truth, and whether it says it was contended."""
    rows = one(seed, ours_apart, 0.02, "charge", theirs, f"lag:{lag_s}", ours_s)
    return [(bool(inside), bool(contended)) for _, _, inside, _, contended in rows]


def test_another_replicas_load_between_scrapes_is_inside_the_uncertainty() -> None:
    """The count is held between scrapes: a scrape in a gap between the other replica's
    requests, or one just before its request ends, was taken as the load until the next,
    with no doubt (64 of 72 inside at eb10309); the count's moves are its doubt now (72)."""
    inside = [hit for seed in range(6) for hit, _ in replicas_scraped(seed)]
    assert sum(inside) >= 0.9 * len(inside), (sum(inside), len(inside))


def test_a_windows_tail_in_another_replicas_time_is_in_its_uncertainty() -> None:
    """Ours 0.4 s apart beside another replica's back-to-back load: a window's ramp-down tail
    after its close went to the load nobody here sees, and its last span was not doubted as
    one shared (settled 0.92-0.97x with 0.4-6% widths: 125 of 144 inside at e1a3c30, 144 now)."""
    inside = [hit for seed in range(12) for hit, _ in replicas_scraped(seed, ours_apart=0.4)]
    assert sum(inside) >= 0.9 * len(inside), (sum(inside), len(inside))


def test_a_count_lagging_our_requests_end_is_no_other_replica() -> None:
    """Our load alone on a server whose count lags by 50 ms (one updated every few steps):
    counting only the windows open during the scrape read our request that had just ended as
    another's: figures contended (67% of them in a hostile's trial, 36 of 48 here at e1a3c30)."""
    rows = [row for seed in range(4) for row in replicas_scraped(seed, theirs=False, lag_s=0.05)]
    assert not any(contended for _, contended in rows), rows
    assert sum(inside for inside, _ in rows) >= 0.9 * len(rows), rows


def test_short_requests_back_to_back_do_not_hide_another_replica() -> None:
    """Ours 30-100 ms long, 5 ms apart, beside another replica's load: every window touching
    a scrape counted as maybe in it, none was surely, so the excess never rose (1.9-2.1x,
    58-70% inside, a hostile review; 224 of 292 inside here at 597cb9a, 292 now)."""
    rows = [row for seed in range(4) for row in replicas_scraped(seed, ours_apart=0.005, ours_s=(0.03, 0.1))]
    assert sum(inside for inside, _ in rows) >= 0.9 * len(rows), rows


def test_a_scrape_too_slow_to_say_when_it_counted_is_not_noted() -> None:
    """A scrape of 0.5-1 s: the windows it may have counted were settled and forgotten by the
    time it was read, and their requests read as another's (80% `contended` with our load
    alone, a hostile review). It is not noted; one of 40 ms is."""
    run = Run(Node("n", idle_w=IDLE, upstream="http://127.0.0.1:9/metrics"))
    run.advance(0.3)
    run.ledger.note_upstream(run.clock.now, 3.0, spread_s=0.4)
    assert not run.ledger.book.decider.unseen.recent(run.clock.now)
    run.ledger.note_upstream(run.clock.now, 3.0, spread_s=0.02)
    assert run.ledger.book.decider.unseen.recent(run.clock.now)


def test_our_request_queued_at_the_server_does_not_hide_another_replicas() -> None:
    """The server runs another replica's request while ours waits in its queue: its running
    count of one is theirs, not ours (a request of ours queued 0.5-1 s took the other's draw
    as its own, 2.1x, a hostile review). What it says it holds queued may be ours."""
    for waiting, hidden in ((0.0, True), (1.0, False)):
        run = Run(Node("n", idle_w=IDLE, upstream="http://127.0.0.1:9/metrics"))
        run.advance(0.3)
        run.ledger.note_upstream(run.clock.now, 1.0)  # theirs, before ours came
        meter = Meter(run.ledger).open()
        run.advance(0.3)
        t = run.clock.now
        run.ledger.note_upstream(t, 1.0, waiting=waiting)  # ours queued (or said nothing of)
        unseen = run.ledger.book.decider.unseen.window_seconds(t, t + 0.25)
        assert math.isclose(unseen, 0.0 if hidden else 0.25), (waiting, unseen)
        meter.close()
