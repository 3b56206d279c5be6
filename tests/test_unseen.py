"""The load no process on the host can see: the upstream's running requests beyond ours."""

from __future__ import annotations

import math

from giul_asgi.ledger.unseen import Unseen


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
