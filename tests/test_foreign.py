"""The foreign-load watch alone (spans in, a level and its doubt out), and the book
subtracting it where it is witnessed only in short gaps between requests."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from test_ledger import IDLE, Run
from truecard import Foreign

from giul_asgi.config import Node
from giul_asgi.ledger.foreign import ForeignWatch
from giul_asgi.ledger.tape import Span
from giul_asgi.meter import Meter


def spans(watts: list[float], seconds: float = 0.1, stamp_s: float = 0.002) -> list[Span]:
    out, t = [], 0.0
    for w in watts:
        out.append(Span(t, t + seconds, w * seconds, (w + IDLE) * seconds, stamp_s, 0.001))
        t += seconds
    return out


def test_a_level_is_believed_only_after_a_period_of_witness() -> None:
    watch = ForeignWatch()
    assert watch.level(0.1, IDLE) is None
    watch.witness(spans([150.0], seconds=0.05)[0], IDLE)
    assert watch.level(0.1, IDLE) is None  # half a period seen
    watch.witness(Span(0.05, 0.1, 7.5, 11.0, 0.002, 0.001), IDLE)
    assert watch.level(0.1, IDLE) == 150.0


def test_one_whole_step_of_a_jittered_counter_is_a_look() -> None:
    # A 100 ms counter's steps jitter: one whole span between two of them, all a fresh
    # process saw in a 250 ms gap, read 96 ms and counted for nothing, so its next two
    # windows charged a 150 W foreign load whole (first figures 1.9-2.3x their truth).
    watch = ForeignWatch()
    watch.witness(spans([150.0], seconds=0.096)[0], IDLE)
    assert watch.level(0.1, IDLE) == pytest.approx(150.0)
    assert watch.doubt_w() > 1.0  # one look is never certain


def test_noise_below_the_floor_is_no_load_and_no_idle_floor_is_no_witness() -> None:
    watch = ForeignWatch()
    for span in spans([2.0, 3.0]):
        watch.witness(span, IDLE)
    assert watch.level(0.1, IDLE) == 0.0
    blind = ForeignWatch()
    blind.witness(spans([150.0])[0], None)
    assert blind.level(0.1, None) is None


def test_the_first_believed_level_is_never_certain() -> None:
    # Issue 16: the scatter was an average that started at zero, so a level witnessed in a
    # few short gaps was subtracted with almost no doubt (42% of settled figures covered).
    watch = ForeignWatch()
    for span in spans([150.0, 150.0]):
        watch.witness(span, IDLE)
    assert watch.doubt_w() > 1.0


def test_doubt_shrinks_as_a_steady_load_is_watched_and_stays_wide_for_a_bursty_one() -> None:
    rng = random.Random(1)
    steady, bursty = ForeignWatch(), ForeignWatch()
    doubts = []
    for i, span in enumerate(spans([150.0 + rng.uniform(-5, 5) for _ in range(200)])):
        steady.witness(span, IDLE)
        if i in (3, 199):
            doubts.append(steady.doubt_w())
    for span in spans([150.0 if (i // 5) % 2 else 0.0 for i in range(200)]):
        bursty.witness(span, IDLE)
    assert doubts[1] < 0.5 * doubts[0]
    assert bursty.doubt_w() > 5 * steady.doubt_w()


def _subtracted_inside(seeds: int, requests: int, gap: Callable[[Run], float], *, quiet_first: float = 0.0,
                       settle_s: float, skip: int = 0,
                       load: Callable[[Run], Foreign] = lambda run: Foreign(150.0, start=run.clock.now - 1.0),
                       ) -> tuple[list[int], int]:
    """A foreign load (150 W, steady unless ``load`` says) subtracted, 300 ms requests ``gap``
    apart on fresh nodes: how many (first, settled) figures held the truth within their
    uncertainty, of how many (the first ``skip`` of each node not counted; only a node's very
    first may say unknown)."""
    hits, n = [0, 0], 0
    for seed in range(seeds):
        run = Run(Node("n", idle_w=IDLE, foreign="subtract"), seed=seed)
        run.card.add_foreign(load(run))
        run.advance(quiet_first)
        done = []
        for _ in range(requests):
            meter, truth = run.request(0.3, 180.0 * run.rng.uniform(0.9, 1.1))
            done.append((meter, meter.figure(), truth))
            run.advance(gap(run))
        run.advance(settle_s)
        for i, (meter, first, truth) in enumerate(done):
            settled = meter.figure()
            assert settled.settled and settled.joules is not None
            if i < skip:
                continue
            if first.joules is None:  # the very first may say so: its node had learnt nothing
                assert i == 0 and first.method == "unknown", first
                continue
            hits[0] += abs(first.joules - truth) <= (first.uncertainty_joules or 0.0)
            hits[1] += abs(settled.joules - truth) <= (settled.uncertainty_joules or 0.0)
            n += 1
        assert run.books() < 1e-9 * run.ledger.totals().measured_j
    return hits, n


def test_a_foreign_load_seen_only_in_short_gaps_is_subtracted_within_its_uncertainty() -> None:
    """Issue 16: 150 W foreign, 250 ms between 300 ms requests, no warm-up: 75% of first
    and 42% of settled figures held the truth within their uncertainty."""
    hits, n = _subtracted_inside(3, 20, lambda run: 0.25, settle_s=0.5)
    assert hits[0] >= 0.9 * n and hits[1] >= 0.9 * n


def _decided(watts: list[float], first_open: float, stamp_s: float = 0.01) -> float | None:
    """A decider's foreign level after quiet spans of ``watts`` and one span whose first
    window opened at ``first_open`` (the host's windows, as the card's holder sees them)."""
    from giul_asgi.ledger.decider import Decider
    from giul_asgi.spans import Coverage

    decider = Decider(ramp_s=0.1, subtract_foreign=False, period=lambda: 0.1)
    quiet = spans(watts, stamp_s=stamp_s)
    for span in quiet:
        decider.decide(span, Coverage(), IDLE)
    t = quiet[-1].t1
    busy = Span(t, t + 0.1, 40.0, 40.0 + IDLE * 0.1, stamp_s, 0.001)
    opened = Coverage(t + 0.1 - first_open, 1, busy=((first_open, t + 0.1),), open_now=1)
    return decider.decide(busy, opened, IDLE).level


def test_a_window_s_ramp_up_stamped_before_it_opened_is_no_foreign_load() -> None:
    """A burst from idle whose first step the tape stamped a few ms early put the windows'
    ramp-up in the quiet span before them: 600 W 'witnessed' with no window open, and every
    window of the burst flagged contended (issue 20; 1 run in 6 of a hostile trial, and the
    suite's four-worker burst once). A quiet span ending within its step's doubt of the next
    open is not witnessed; a quiet span well before it is."""
    assert _decided([0.0, 600.0], first_open=0.2 + 0.004) == 0.0  # 4 ms after: the stamp's doubt
    assert _decided([100.0, 100.0], first_open=0.2 + 0.05) == pytest.approx(100.0)  # a load in a real gap
    assert _decided([100.0, 100.0], first_open=0.2 + 0.004) == pytest.approx(100.0)  # the first span alone


def test_what_an_edge_s_step_doubt_can_move_is_no_foreign_load() -> None:
    """Half a second of an idle card read once a period (brackets a period wide: each step
    in doubt by 50 ms), the last quiet span before a burst holding 3.5 J of its neighbour's
    (its step stamped 50 ms early): 7 W over what was seen, which flagged a burst from idle
    contended. What one misplaced edge can add is no load; a real 100 W load seen through
    the same doubts is, and a 7 W one seen through narrow stamps is too."""
    watch = ForeignWatch()
    for span in spans([0.0, 0.0, 0.0, 0.0, 35.0], stamp_s=0.05):
        watch.witness(span, IDLE)
    assert watch.level(0.1, IDLE) == 0.0
    loaded = ForeignWatch()
    for span in spans([100.0] * 5, stamp_s=0.05):
        loaded.witness(span, IDLE)
    assert loaded.level(0.1, IDLE) == pytest.approx(100.0)
    narrow = ForeignWatch()
    for span in spans([7.0] * 5, stamp_s=0.002):
        narrow.witness(span, IDLE)
    assert narrow.level(0.1, IDLE) == pytest.approx(7.0)


def _blind_burst(run: Run, watts: float = 180.0, n: int = 4) -> list[tuple[Meter, float]]:
    """A fresh process's first requests, back to back (a gap shorter than a ramp-down: the
    card is never seen quiet), each with its truth."""
    early = []
    for _ in range(n):
        early.append(run.request(0.3, watts))
        run.advance(0.02)
    return early


def _then_spaced(run: Run, watts: float = 180.0, n: int = 6) -> None:
    """Requests with quiet gaps between them (the card is looked at), then time to settle."""
    for _ in range(n):
        run.request(0.3, watts)
        run.advance(0.4)
    run.advance(0.5)


def test_windows_before_the_first_witness_wait_and_have_the_foreign_load_taken_off() -> None:
    """A fresh process under a steady 150 W foreign load, its first requests back to back
    (no quiet time to witness the load in), then 400 ms gaps. Those first windows were
    charged the foreign load: settled at 2.3-2.8x their truth, said ``measured`` (the
    attribution matrix's "250 ms gaps" scenario, 4 runs in 11 at 1.17-1.22x). They now wait
    until the card is looked at and the node has learnt what its windows draw, and have what
    both say was foreign taken off."""
    for seed in range(3):
        run = Run(Node("n", idle_w=IDLE, foreign="subtract"), seed=seed)
        run.card.add_foreign(Foreign(150.0, start=run.clock.now - 1.0))
        early = _blind_burst(run)
        for meter, _ in early:
            first = meter.figure()
            assert not first.settled  # waiting for a level, and says so
            assert first.joules is None or "nobody could look for yet" in (first.error or ""), first
        _then_spaced(run)
        for meter, truth in early:
            settled = meter.figure()
            assert settled.settled and settled.joules is not None, settled
            assert abs(settled.joules - truth) <= 0.15 * truth, (seed, settled.joules, truth)
            assert abs(settled.joules - truth) <= settled.uncertainty_joules
            # Nothing says how much of those spans was foreign: the doubt stays all of them,
            # and the figure says so.
            assert settled.contended is True and "taken off" in (settled.error or "")
        totals = run.ledger.totals()
        assert run.books() < 1e-9 * totals.measured_j
        assert totals.foreign_j > 0.5 * 150.0 * 4 * 0.3  # what was taken off the early windows


def test_a_card_never_seen_quiet_holds_no_window_past_the_wait() -> None:
    """Back-to-back requests under a foreign load nobody can witness: each window waits
    for a level at most ``MAX_WAIT_S`` after its close, then settles as charged, its doubt
    all of its share (the load may all be foreign)."""
    from giul_asgi.ledger.book import MAX_WAIT_S

    run = Run(Node("n", idle_w=IDLE, foreign="subtract"))
    run.card.add_foreign(Foreign(150.0, start=run.clock.now - 1.0))
    first, truth = run.request(0.3, 180.0)
    waited = 0.0
    while not first.figure().settled:
        run.request(0.3, 180.0)
        waited += 0.3
        assert waited < MAX_WAIT_S + 1.0
    assert waited > MAX_WAIT_S - 1.0
    settled = first.figure()
    assert settled.joules is not None and settled.joules > 1.5 * truth  # charged the load
    assert abs(settled.joules - truth) <= settled.uncertainty_joules
    assert "charged whole" in (settled.error or "")  # and says why its doubt is all of it
    assert run.books() < 1e-9 * run.ledger.totals().measured_j


def test_a_foreign_load_that_began_after_the_first_windows_is_not_taken_off_them() -> None:
    """A hostile trial: no foreign load under a fresh process's first requests, back to
    back; a 150 W one starts right after them. The level seen later was taken off them:
    0.17x their truth, a quarter outside their doubt. What each drew is judged at the rate
    the node's windows are measured drawing once the load is watched, not by the level."""
    for seed in range(3):
        run = Run(Node("n", idle_w=IDLE, foreign="subtract"), seed=seed)
        early = _blind_burst(run)
        run.card.add_foreign(Foreign(150.0, start=run.clock.now))
        _then_spaced(run)
        for meter, truth in early:
            settled = meter.figure()
            assert settled.settled and settled.joules is not None, settled
            assert 0.75 * truth <= settled.joules <= 1.25 * truth, (seed, settled.joules, truth)
            assert abs(settled.joules - truth) <= settled.uncertainty_joules
        assert run.books() < 1e-9 * run.ledger.totals().measured_j


def test_what_is_taken_off_late_is_taken_off_the_stages_too() -> None:
    """A hostile trial: the late subtraction left a window's stages as they were: a prefill
    stage of 65 J inside a 32 J request. Its stages keep their proportions of what is left."""
    run = Run(Node("n", idle_w=IDLE, foreign="subtract"))
    run.card.add_foreign(Foreign(150.0, start=run.clock.now - 1.0))
    early = []
    for _ in range(4):
        early.append(run.marked(100.0, 0.25, "prefill", 0.05))
        run.advance(0.02)
    _then_spaced(run, 100.0)
    for meter in early:
        figure = meter.figure()
        assert figure.settled and figure.joules is not None
        prefill = figure.stages["prefill"].joules
        assert prefill is not None and 0 < prefill <= figure.joules


def test_a_blind_window_heavier_than_those_after_it_keeps_its_own_draw() -> None:
    """A second hostile trial: no foreign load at all; a fresh process's first requests draw
    300 W, the ones after 100 W. Judged at the node's rate alone (learnt from the lighter
    ones), the rest of their draw was taken off as foreign: 0.30x their truth, 0/20 inside
    their doubt. The level seen (0 W) says none was foreign: nothing is taken. (A process's
    very first window has time before the card's first reading, filled at the node's rate:
    the lighter windows', so it alone comes out low, inside its doubt.)"""
    ratios = []
    for seed in range(3):
        run = Run(Node("n", idle_w=IDLE, foreign="subtract"), seed=seed)
        early = _blind_burst(run, 300.0)
        _then_spaced(run, 100.0)
        for meter, truth in early:
            settled = meter.figure()
            assert settled.settled and settled.joules is not None, settled
            assert abs(settled.joules - truth) <= settled.uncertainty_joules
            ratios.append(settled.joules / truth)
    assert 0.9 <= sorted(ratios)[len(ratios) // 2] <= 1.1 and min(ratios) > 0.6, ratios


def test_a_steady_foreign_load_seen_in_few_short_gaps_is_subtracted_within_its_uncertainty() -> None:
    """150 W foreign, 300 ms requests 0.1-0.3 s apart: the card is rarely quiet long enough
    for a look past a request's ramp-down, and a fresh node's level rests on a look or two.
    (The same with the load in bursts held 67-79% of settled figures, 93% since a level's doubt
    grows while it goes unseen: benchmarks/results/foreign_stale-2026-12-07.md.)"""
    hits, n = _subtracted_inside(8, 12, lambda run: 0.1 + 0.2 * run.rng.random(), quiet_first=0.3,
                                 settle_s=1.0, skip=2)  # a fresh node's first two teach it its rate
    assert hits[0] >= 0.9 * n and hits[1] >= 0.9 * n, (hits, n)


def test_a_level_seen_once_is_doubted_the_more_the_longer_it_goes_unseen() -> None:
    watch = ForeignWatch()
    watch.witness(spans([150.0])[0], IDLE)
    seen = watch.seen_t
    assert seen is not None
    assert watch.moved_w(seen, 150.0, 330.0) == 0.0  # the last look is the level
    moved = [watch.moved_w(seen + age, 150.0, 330.0) for age in (0.1, 0.5, 1.0, 10.0)]
    assert 0.0 < moved[0] < moved[1] < moved[2] == moved[3] == 180.0  # none of it, or all the draw
    assert watch.moved_w(seen + 10.0, 0.0, 180.0) == 180.0  # a load may appear unseen
    held = ForeignWatch()  # the same level seen to hold for 20 s is trusted longer unseen...
    for span in spans([150.0] * 200):
        held.witness(span, IDLE)
    assert held.seen_t is not None
    assert held.moved_w(held.seen_t + 1.0, 150.0, 330.0) < 0.2 * 180.0
    # ... but for 10 s at most: a load that held for an hour may stop (a hostile trial: an hour
    # of looks at it made the doubt of 3 s unseen 0.2 W)
    assert held.moved_w(held.seen_t + 10.0, 150.0, 330.0) == 180.0
    held.witness(Span(20.0, 20.1, 30.0, 30.0 + IDLE * 0.1, 0.002, 0.001), IDLE)  # a look at 300 W
    assert held.moved_w(20.1, 150.0, 330.0) >= 140.0  # how far the last look strayed
    assert held.moved_w(21.1, 150.0, 330.0) == 180.0  # and the level held for no time since


def test_a_bursty_load_seen_once_before_back_to_back_requests_is_inside_its_uncertainty() -> None:
    """Bursts of 150 W, 0.4 s on and 0.6 s off, seen in one look before 300 ms requests 50-100 ms
    apart (never quiet past a ramp-down again): the level of that one look was taken off for good
    with that look's doubt, and 33-58% of first and settled figures held the truth (a hostile
    harness, 12 seeds; each seed's bursts at a phase of its own here)."""
    def bursts(run: Run) -> Foreign:
        return Foreign(150.0, start=run.clock.now - 1.0 - run.rng.uniform(0.0, 1.0), on_s=0.4, off_s=0.6)

    hits, n = _subtracted_inside(8, 12, lambda run: 0.05 + 0.05 * run.rng.random(), quiet_first=0.3,
                                 settle_s=1.0, skip=2, load=bursts)
    assert hits[0] >= 0.9 * n and hits[1] >= 0.9 * n, (hits, n)


def test_a_floor_set_high_is_doubted_by_what_the_last_look_saw() -> None:
    """``idle_w`` 10 W above what the card draws idle, ``foreign="subtract"``, no foreign load:
    each quiet look reads the card 10 W below the floor, a level of nothing is taken off, and
    every window is charged 10 W of its time short. The doubt of the level taken off said
    nothing of it: 23 of 160 settled figures of requests 20-39 held the truth (107 with the
    doubt grown by time unseen alone); the last look's distance from the level is in it now."""
    hits, n = 0, 0
    for seed in range(8):
        run = Run(Node("n", idle_w=IDLE + 10.0, foreign="subtract"), seed=seed)
        run.advance(0.3)
        done = []
        for _ in range(40):
            done.append(run.request(0.3, 180.0 * run.rng.uniform(0.9, 1.1)))
            run.advance(0.1 + 0.2 * run.rng.random())
        run.advance(1.0)
        for meter, truth in done[20:]:
            settled = meter.figure()
            assert settled.settled and settled.joules is not None
            hits += abs(settled.joules - truth) <= settled.uncertainty_joules
            n += 1
    assert hits >= 0.9 * n, (hits, n)
