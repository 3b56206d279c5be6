"""A fresh process's first figures are honest from the very first request (issue 21 item 2).

The demo's first streamed answer said 0.00277 J +- 0.00291 where it settled at 2.83 J; then
2.58 +- 6,871.9; a fresh server's first 50 ms answer 0.304 +- 0.319 J against 7.47 J
settled. Here fresh ledgers (nothing learnt, no warm-up) serve 12 requests each, of random
lengths and power (benchmarks/cold_start.py, which prints the same over more trials), and
their first figures are held against their settled figures and the card's truth.
"""

from __future__ import annotations

import asyncio
import statistics

import cold_start


def test_first_figures_of_fresh_ledgers_cover_their_settled_ones_9_in_10_on_a_counter() -> None:
    figures = [f for seed in range(30) for f in cold_start.counter_trial(seed)]
    both = [f for f in figures if f.first is not None and f.settled is not None and f.first_unc is not None]
    assert len(both) >= 0.7 * len(figures)  # the rest: the very first, or requests of no time
    covered = [f for f in both if abs(f.first - f.settled) <= f.first_unc]
    truth = [f for f in both if abs(f.first - f.truth) <= f.first_unc]
    assert len(covered) >= 0.9 * len(both) and len(truth) >= 0.9 * len(both)
    # Never a near-zero; and no wider than the figure itself once the node saw a step.
    assert not [f for f in both if f.settled > 0 and f.first < 0.1 * f.settled]
    wide = [f for f in both if f.stepped and f.first_unc > f.first]
    assert len(wide) <= 0.03 * len(both), wide[:3]
    # A node that knows nothing says so: no figure rather than a made-up one.
    for f in figures:
        if f.first is None:
            assert f.first_method == "unknown"


def test_first_figures_on_the_simulated_card_are_never_near_zero_nor_far_outside_their_doubt() -> None:
    figures = [f for seed in range(3) for f in asyncio.run(cold_start.simulated_trial(seed))]
    both = [f for f in figures if f.first is not None and f.settled is not None and f.first_unc is not None]
    assert len(both) >= 0.6 * len(figures)
    assert not [f for f in both if f.settled > 0 and f.first < 0.1 * f.settled]
    # The real clock under a loaded machine (a stranger's run of the suite found one figure
    # 5.0 +- 2.9 J against 13.1 settled): at most one in ten more than its doubt plus its own
    # size off, and most inside their doubt (88% at a load of 8 on 2 cores, 58 figures).
    far = [f for f in both if abs(f.first - f.settled) > f.first_unc + f.first]
    assert len(far) <= 0.1 * len(both), far[:3]
    inside = [f for f in both if abs(f.first - f.settled) <= f.first_unc]
    assert len(inside) >= 0.7 * len(both), [f for f in both if f not in inside][:3]


def test_first_figures_under_steady_load_are_as_narrow_as_their_calibration_allows() -> None:
    # 16 in flight, one request in five of 0.4 s and the rest of 50 ms, on a counter card
    # (virtual clock). The measured part's doubt and the guess's were added: 0.4 s figures
    # 19.5% wide and 50 ms ones wider than themselves 28% of the time, all covering 99-100%.
    # The requests draw 60-200 W each, shared by time: settled figures are a median 21% off
    # what their requests caused, and since the time split says its own doubt (doubt.py) the
    # first figures hold the truth too (0.4 s: 40% -> 100%; 50 ms: 86% -> 100%), 0.94 and
    # 1.17 wide (were 0.15 and 0.62). Within 2.5 s of a cold start most of that is the cold
    # spread of the first stretches, ranked in the prior's growth for the whole run. Since
    # the part not shared at close is priced at the learnt spread (the same request's
    # deviation, added to its measured part's), 0.4 s figures are 0.97 wide (0.93 without)
    # and 31% of them wider than themselves (4%), the truth inside for 99%: a 60-200 W mix
    # shared by time is that far from what each request caused.
    figures = [f for seed in range(3) for f in cold_start.mixed_trial(seed) if f.index >= 50]
    for seconds, most_wide, most_wider in ((0.4, 1.0, 0.35), (0.05, 1.25, 0.95)):
        mine = [f for f in figures if f.seconds == seconds and f.first and f.settled is not None
                and f.first_unc is not None]
        assert len(mine) >= 150
        covered = [f for f in mine if abs(f.first - f.settled) <= f.first_unc]
        assert len(covered) >= 0.9 * len(mine)
        truth = [f for f in mine if abs(f.first - f.truth) <= f.first_unc]
        assert len(truth) >= 0.9 * len(mine)
        assert statistics.median(f.first_unc / f.first for f in mine) <= most_wide
        wider = [f for f in mine if f.first_unc > f.first]
        assert len(wider) <= most_wider * len(mine), wider[:3]


def test_a_fresh_process_covers_the_requests_that_end_as_a_burst_drains() -> None:
    # A stranger's trial: the last completions of each burst were covered 24 of 36 times,
    # every miss low (the card draws more for each request as its batch empties), the rest
    # 368 of 369. Their class has too few settled in a fresh process to rank its own spread.
    figures = [f for seed in range(20) for f in cold_start.draining_trial(seed, bursts=4, skip=0)]
    for draining, least in ((1, 0.95), (0, 0.99)):
        mine = [f for f in figures if f.index == draining and f.first and f.settled is not None
                and f.first_unc is not None]
        covered = [f for f in mine if abs(f.first - f.settled) <= f.first_unc]
        assert len(covered) >= least * len(mine), (len(covered), len(mine))


def test_first_figures_of_isolated_windows_of_one_length_count_their_tail_once() -> None:
    # Isolated 30 ms requests of about one length: the prior's line is one rate through the
    # origin, each window's ramp-down tail (40% of its truth) in it. Where the card had
    # reported part of a window by its close, the rest was guessed at that rate with a tail
    # at it beside: first figures 27-66% high, p90 35-54% (benchmarks/attribution.py).
    figures = [f for seed in range(6) for f in cold_start.alike_trial(seed) if f.index >= 5]
    both = [f for f in figures if f.first is not None and f.first_unc is not None and f.truth]
    assert len(both) >= 0.95 * len(figures)
    errors = sorted(abs(f.first - f.truth) / f.truth for f in both)  # type: ignore[operator]
    assert errors[int(0.9 * len(errors))] <= 0.2, errors[int(0.9 * len(errors)):]
    inside = [f for f in both if abs(f.first - f.truth) <= f.first_unc]  # type: ignore[operator]
    assert len(inside) >= 0.9 * len(both)
    assert statistics.median(f.first_unc / f.first for f in both) <= 0.4  # type: ignore[operator]


def test_first_figures_split_by_tokens_follow_each_requests_own_rate() -> None:
    # Fresh ledgers split by tokens, 24 overlapping requests each at 20-120 tokens a second,
    # drawing in proportion (benchmarks/cold_start.py's token trial: the card's truth, not the
    # ledger's, says what each caused). Guessed at the mean window's rate, the part of a
    # window not shared at close came out 28% off the truth at the median and 127% at p90
    # (20 trials); scaled by the window's weight against the closed windows' mean, 10% and
    # 35-41%; with the prior learning settled windows as if of the mean weight too (its line
    # through their shares had their rates in its slope), 8% and 20-22%. The first figure's
    # doubt still covers its settled figure.
    figures = [f for seed in range(10) for f in cold_start.token_trial(seed)]
    both = [f for f in figures if f.first is not None and f.settled and f.truth]
    assert len(both) >= 0.9 * len(figures)
    off = sorted(abs(f.first - f.truth) / f.truth for f in both)
    assert statistics.median(off) <= 0.15 and off[int(0.9 * len(off))] <= 0.30, off[-5:]
    covered = [f for f in both if abs(f.first - f.settled) <= f.first_unc]
    assert len(covered) >= 0.9 * len(both)
