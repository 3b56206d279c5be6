"""Windows and the splits that share a span among them."""

from __future__ import annotations

import pytest

from giul_asgi.ledger import Split, TimeSplit, TokenSplit, Window
from giul_asgi.ledger import window as window_module
from giul_asgi.ledger.members import Windows
from giul_asgi.ledger.window import spread


def test_the_ledger_still_exports_the_window_and_its_splits() -> None:
    assert Window is window_module.Window and TimeSplit is window_module.TimeSplit
    assert TokenSplit is window_module.TokenSplit and Split is window_module.Split


def test_time_split_weighs_every_window_alike_from_open() -> None:
    w = Window(0.0, 0.0)
    assert TimeSplit.known_at_open and TimeSplit().weight(w) == 1.0


def test_token_split_knows_a_weight_only_at_close_with_a_real_count() -> None:
    split = TokenSplit()
    w = Window(1.0, 0.0)
    assert split.weight(w) is None  # open
    w.t_close = 3.0
    for bad in (None, 0, -4):
        w.tokens = bad
        assert split.weight(w) is None
    w.tokens = 100
    assert split.weight(w) == 50.0


def test_a_window_without_time_is_alone_and_has_no_concurrency_while_open() -> None:
    members = Windows(ramp_s=0.1)
    w = members.enter(Window(5.0, 0.0))
    assert w.seconds == 0.0 and w.concurrency is None
    assert members.shut(w, 5.0)
    assert w.concurrency == 1.0


def test_a_windows_concurrency_is_the_windows_in_flight_over_its_time() -> None:
    members = Windows(ramp_s=0.1)
    a = members.enter(Window(0.0, 0.0))
    b = members.enter(Window(1.0, 0.0))  # beside a for 1 s of a's 2
    members.shut(b, 2.0)
    members.shut(a, 2.0)
    assert a.concurrency == pytest.approx(1.5) and b.concurrency == pytest.approx(2.0)


def test_a_value_is_spread_over_stages_by_time() -> None:
    w = Window(0.0, 0.0)
    w.marks = [("retrieve", 1.0), ("generate", 3.0)]
    into = [0.0, 0.0, 0.0]
    spread(w, 0.5, 3.5, 6.0, into)
    assert into == [1.0, 4.0, 1.0]
    spread(w, 2.0, 2.0, 5.0, into)  # an empty interval adds nothing
    assert into == [1.0, 4.0, 1.0]
