"""Servers on one card whose operators gave it different idle floors say which floor they are above.

The process reading the card (its holder) cuts the energy above its node's ``idle_w`` and
publishes the spans; every other process on the host takes its part. Two servers set apart (a
chat and an embeddings gateway on one GPU, a release that mends ``idle_w`` beside the last one)
may give the card different floors. A follower took the holder's cut labelled with its own
floor: 1.5x its truth, outside its doubt 11 times in 12, nothing said (a hostile trial). The
holder now writes the floor with each span; a follower whose node gives another says so once in
the log, and its figures say the floor they are above. (Cut again above each node's own, the
card's one set of books lost the floors' difference: a conservation error on the follower's.)
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import pytest
from truecard import TrueCard
from workers_card import FileCard, FileCardReader, jobs_of

from giul_asgi.config import Node
from giul_asgi.hostshare.cards import CardTable
from giul_asgi.hostshare.cards.layout import U64
from giul_asgi.ledger import Ledger
from giul_asgi.meter import Meter
from giul_asgi.spans import CardSpan

CARD_IDLE_W = 70.0


def _span(**kw: object) -> CardSpan:
    fields: dict[str, object] = dict(
        t0=10.0, t1=11.0, above_j=100.0, total_j=130.0, stamp_s=0.001, unc_j=0.001, measured_j=100.0,
        tails=False, covered=1.0, members=1, unseen=0.0, foreign_j=0.0, quiet=False, doubt_w=0.0,
        foreign_unc_w=0.0, unwatched=False, busy_s=1.0)
    fields.update(kw)
    return CardSpan(**fields)  # type: ignore[arg-type]


def test_each_span_says_the_floor_its_holder_cut_it_above_and_an_earlier_releases_none(
    tmp_path: Path,
) -> None:
    """Per piece: a floor on the tape's header outlived its holder, and a later holder of an
    earlier release (which writes none) had its spans cut again with it, 0.48x their truth (a
    hostile trial)."""
    holder = CardTable(tmp_path, "card:floors", "n", idle_w=30.0)
    follower = CardTable(tmp_path, "card:floors", "n", idle_w=70.0)
    try:
        assert holder.try_hold()
        span = _span()
        holder.publish(span, {}, 0.1)
        holder.tape.write(holder.tape.published(), span, 0.1)  # as an earlier release writes it
        U64.pack_into(holder.tape.mm, 16, holder.tape.published() + 1)
        holder.tape.write(holder.tape.published(), span, 0.1, math.inf)  # garbage: not known
        U64.pack_into(holder.tape.mm, 16, holder.tape.published() + 1)
        pieces = [p for p, _ in follower.pending()]
        assert [p.cut_above_w for p in pieces if isinstance(p, CardSpan)] == [30.0, None, None]
    finally:
        holder.close()
        follower.close()


def _until(condition: object, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _truths(path: Path, jobs: list[str]) -> list[float]:
    card, known = TrueCard(), jobs_of(path)
    return [known[job].truth(card.ramp_up, card.tau) for job in jobs]


def test_a_follower_with_another_floor_says_the_floor_its_figures_are_above(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """The hostile trial's shape: the holder's operator says 30 W, the card idles at 70 W,
    and the follower's operator says 70 W; only the follower serves requests."""
    path = FileCard.create(tmp_path / "card.txt", idle_w=CARD_IDLE_W)
    place = tmp_path / "place"
    place.mkdir(mode=0o700)

    def ledger(name: str, idle_w: float) -> Ledger:
        return Ledger(Node(name, idle_w=idle_w, workers_dir=str(place),
                           reader_factory=lambda _n: FileCardReader(path)))

    holder = ledger("chat", 30.0)
    follower = ledger("embeddings", CARD_IDLE_W)
    card = FileCard(path)
    try:
        holder.ensure_started()
        _until(lambda: holder.table is not None and holder.table.holding)
        with caplog.at_level(logging.WARNING, logger="giul_asgi.ledger"):
            follower.ensure_started()
            _until(lambda: follower.table is not None)
            meters, jobs = [], []
            for _ in range(8):  # isolated 100 ms requests of 200 W
                meter = Meter(follower)
                meter.open()
                jobs.append(card.start_job(200.0))
                time.sleep(0.1)
                card.stop_job(jobs[-1])
                meter.close()
                meters.append(meter)
                time.sleep(0.35)
            _until(lambda: all(m.settled_now for m in meters))
        figures = [m.figure() for m in meters]
        truths = _truths(path, jobs)
        # Above 30 W, each window has the card's idle above that floor over its time and its
        # tail's besides its truth above 70 W (1.5x it here): more, and saying why.
        assert sum(f.joules or 0.0 for f in figures) > 1.2 * sum(truths)
        for f in figures:
            assert f.idle_watts == 30.0 and f.method == "measured"
            assert f.error is not None and "idle floor of 30 W" in f.error and "idle_w is 70 W" in f.error, f
        said = [r.getMessage() for r in caplog.records if "idle floor of 30 W" in r.getMessage()]
        assert len(said) == 1 and "this node's idle_w is 70 W" in said[0], said
        for books in (holder.totals(), follower.totals()):  # one card, one cut: balanced
            assert abs(books.conservation_error_j) <= 1e-6 * max(1.0, books.measured_j), books
    finally:
        follower.stop(1.0)
        holder.stop(1.0)


def test_once_the_floors_agree_again_the_figures_say_this_nodes_floor(tmp_path: Path) -> None:
    """A holder with another floor, then one with this node's (the other server stopped):
    the caveat goes and the figures are above this node's floor again, said once each way."""
    path = FileCard.create(tmp_path / "card.txt", idle_w=CARD_IDLE_W)
    ledger = Ledger(Node("embeddings", idle_w=CARD_IDLE_W, reader_factory=lambda _n: FileCardReader(path)))
    ledger.attach(FileCardReader(path))
    ledger._floor_of(30.0)
    assert ledger.provenance.idle_watts == 30.0 and ledger.floor_caveat is not None
    ledger._floor_of(30.0)  # said already: nothing changes
    assert ledger.floor_caveat is not None and "idle floor of 30 W" in ledger.floor_caveat
    ledger._floor_of(CARD_IDLE_W)
    assert ledger.provenance.idle_watts == CARD_IDLE_W and ledger.floor_caveat is None
    ledger._floor_of(0.0)  # a reader whose node gives no floor
    assert ledger.provenance.idle_watts == 0.0 and "idle floor of 0 W" in (ledger.floor_caveat or "")
