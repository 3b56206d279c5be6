"""Servers on one card whose operators gave it different idle floors each charge above their own.

The process reading the card (its holder) cuts the energy above its node's ``idle_w`` and
publishes the spans; every other process on the host takes its part. Two servers set apart (a
chat and an embeddings gateway on one GPU, a release that mends ``idle_w`` beside the last one)
may give the card different floors. A follower took the holder's cut labelled with its own
floor: 1.5x its truth, outside its doubt 11 times in 12 (a hostile trial). The holder now writes
its floor on the tape, and a follower whose floor differs cuts the spans again above its own.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import pytest
from truecard import TrueCard
from workers_card import FileCard, FileCardReader, apply

from giul_asgi.config import Node
from giul_asgi.hostshare.cards import CardTable
from giul_asgi.hostshare.cards.layout import U64
from giul_asgi.ledger import Ledger
from giul_asgi.meter import Meter
from giul_asgi.spans import CardSpan, recut

CARD_IDLE_W = 70.0


def _span(**kw: object) -> CardSpan:
    fields: dict[str, object] = dict(
        t0=10.0, t1=11.0, above_j=100.0, total_j=130.0, stamp_s=0.001, unc_j=0.001, measured_j=100.0,
        tails=False, covered=1.0, members=1, unseen=0.0, foreign_j=0.0, quiet=False, doubt_w=0.0,
        foreign_unc_w=0.0, unwatched=False, busy_s=1.0)
    fields.update(kw)
    return CardSpan(**fields)  # type: ignore[arg-type]


def test_a_span_cut_again_above_another_floor_moves_by_the_floors_difference() -> None:
    span = _span(level=40.0)  # cut above 30 W: the card's idle read as a 40 W foreign load
    mine = recut(span, 30.0, 70.0)
    assert mine.total_j == span.total_j
    assert mine.measured_j == pytest.approx(60.0) and mine.above_j == pytest.approx(60.0)
    assert mine.idle_j == pytest.approx(70.0)  # the floor the follower's allocated basis shares
    assert mine.level == 0.0  # nobody's load above the follower's floor
    assert recut(span, 30.0, 30.0) is span
    assert recut(_span(level=42.0), 30.0, 70.0, least_w=5.0).level == 0.0  # 2 W left: noise here
    assert recut(_span(level=52.0), 30.0, 70.0, least_w=5.0).level == pytest.approx(12.0)
    # A load the holder subtracted comes off again at the level above the follower's floor.
    subtracted = _span(above_j=60.0, foreign_j=40.0, level=40.0, total_j=170.0, measured_j=100.0)
    lower = recut(subtracted, 70.0, 50.0)  # the follower's floor 20 W lower: 20 W more above
    assert lower.measured_j == pytest.approx(120.0) and lower.level == pytest.approx(60.0)
    assert lower.foreign_j == pytest.approx(60.0) and lower.above_j == pytest.approx(60.0)


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
    card, known, done = TrueCard(), {}, []  # type: ignore[var-annotated]
    for line in path.read_text().splitlines()[1:]:
        apply(line, known, done)
    return [known[job].truth(card.ramp_up, card.tau) for job in jobs]


def test_a_follower_with_another_floor_charges_above_its_own(
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
        charged = sum(f.joules or 0.0 for f in figures)
        assert charged == pytest.approx(sum(truths), rel=0.1), (charged, sum(truths))  # was 1.5x
        inside = [abs((f.joules or 0.0) - t) <= (f.uncertainty_joules or 0.0)
                  for f, t in zip(figures, truths, strict=True)]
        assert sum(inside) >= 6, list(zip(figures, truths, strict=True))
        assert not any(f.contended for f in figures)  # the holder's floor is nobody's load
        assert all(f.idle_watts == CARD_IDLE_W for f in figures)
        said = [r.getMessage() for r in caplog.records if "idle floor of 30 W" in r.getMessage()]
        assert len(said) == 1 and "this node's idle_w is 70 W" in said[0], said
    finally:
        follower.stop(1.0)
        holder.stop(1.0)
