"""One request's time on a node, and the rules that split a span of energy among windows.

A :class:`Window` is what the request path holds: two times, a few marks, and what the
book has charged to it so far. A :class:`Split` says how a span's energy is divided among
the windows in it: by time (:class:`TimeSplit`), or by time x tokens per second
(:class:`TokenSplit`), whose weights are known only when a window closes, so a span may
wait for them (:class:`Waiting`).

These are plain records with no clock, no lock and no reference to the book that fills
them: the book, the prior and the watches all read and write them under the ledger's lock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ..spans import CardSpan


class Split(Protocol):
    """How a span's energy is divided among the windows in it."""

    #: The name the record's ``split`` field shows for a shared span.
    name: str
    #: True when every window's weight is known at open: spans never wait.
    known_at_open: bool

    def weight(self, window: Window) -> float | None:
        """The window's weight per second of overlap; None when not known (yet)."""
        ...


class TimeSplit:
    """Each window's share is proportional to its time in the span."""

    name = "time"
    known_at_open = True

    def weight(self, window: Window) -> float | None:
        return 1.0


class TokenSplit:
    """Shares proportional to time x tokens per second: equal energy per token, as in a
    continuous batch. A window's weight is known only when it closes with its count."""

    name = "tokens"
    known_at_open = False

    def weight(self, window: Window) -> float | None:
        if window.tokens is None or window.tokens <= 0 or window.t_close is None:
            return None
        return window.tokens / max(window.t_close - window.t_open, 1e-9)


@dataclass(slots=True)
class First:
    """What the window's first figure assumed: kept to learn from when it settles."""

    reported: float  # the share already reported at close
    guess: float  # the interpolated part, prior x time (before the learnt bias)
    scale: float  # the residual's unit: the guess, with at least a quarter period in it
    unc: float = 0.0  # the measured part's uncertainty at close
    filled: float = 0.0  # the window's time no reading would cover, known at close
    basis: str | None = None  # what the guess was taken from, in words
    #: Fewer windows open at close than the window mostly ran beside (a burst draining): the
    #: card's draw per window rises as they go, so its guess misses otherwise (its class).
    draining: bool = False


@dataclass(slots=True)
class Unwatched:
    """What a window was charged of spans that may hold a foreign load nobody could look
    for yet (``foreign="subtract"`` before any quiet time was witnessed): its share of them,
    its own time in them (and whether a ramp-down tail of it was among them), and its part
    of their time as the card's (what a foreign level there would be taken off over)."""

    joules: float = 0.0
    seconds: float = 0.0
    tail: bool = False
    card_s: float = 0.0
    #: A span of them carried load nobody on the host sees: none is taken off (the decider
    #: takes no foreign level off such a span either).
    unseen: bool = False
    #: What both witnesses say was foreign was taken off: the window may settle (its first
    #: figure, made blind, still teaches the prior nothing).
    seen: bool = False


class Window:
    """One request's time on a node, and what the book has charged to it so far.

    A plain slotted class: one is built per request, and the constructor sets only what
    every window has.

    ``filled_s`` is time in the window that no reading will ever cover (before the tape's
    first step, or inside a gap where the reader failed): its energy is not measured, and
    the window's figure fills it from the node's prior (``fill_j``, ``fill_unc`` once
    settled). ``trouble`` says why, when the reader was failing or reset during it.
    """

    __slots__ = (
        "abandoned",
        "alone",
        "basis",
        "busy_close",
        "busy_open",
        "callbacks",
        "concurrency",
        "edge_sq",
        "error",
        "fill_j",
        "fill_unc",
        "filled_s",
        "first",
        "host_busy_s",
        "idle_share",
        "linear_unc",
        "lost_s",
        "marks",
        "measured_s",
        "phase_end",
        "power_j",
        "rate_lin",
        "rate_own",
        "rate_units",
        "rules",
        "seen_end",
        "seq",
        "settled",
        "share",
        "shared_prefill_s",
        "split_lin",
        "split_own",
        "split_sq",
        "stage_shares",
        "t_close",
        "t_open",
        "tokens",
        "tried_at",
        "trouble",
        "unwatched",
        "usage",
        "waiting",
        "waits_on",
        "weight",
    )

    def __init__(self, t_open: float, busy_open: float, seq: int = 0) -> None:
        self.t_open = t_open
        #: The window's number in its book: what the card's table knows it by.
        self.seq = seq
        self.busy_open = busy_open
        self.t_close: float | None = None
        self.busy_close = 0.0
        #: What the prior had learnt when a cold fill last found nothing (-1: never tried).
        self.tried_at = -1
        #: The windows in flight beside it on average over its time (its own book's), known
        #: at its close (:meth:`~giul_asgi.ledger.members.Windows.shut`); None while open.
        #: Kept, not recomputed: a first figure asked for it five times.
        self.concurrency: float | None = None
        self.tokens: int | None = None
        #: The request's (prompt, completion) token counts, from ``usage``, given at close.
        self.usage: tuple[int, int] | None = None
        self.weight: float | None = None
        #: Where its prefill ended, for the phase split (NaN: unknown; None: not fixed yet),
        #: and how much of its prefill the spans shared so far held.
        self.phase_end: float | None = None
        self.shared_prefill_s = 0.0
        self.marks: list[tuple[str, float]] | None = None
        self.stage_shares: list[float] | None = None
        self.share = 0.0
        #: Its part of the idle floor of the spans it was open in (the allocated basis).
        self.idle_share = 0.0
        self.edge_sq = 0.0  # squared ambiguity of partly covered spans
        self.linear_unc = 0.0  # stamp and foreign-level uncertainty, added linearly
        #: What the phase split itself cannot know of its shares, independent of the card's
        #: doubts, each adding up span after span (``split_lin``: its rates' error;
        #: ``split_own``: the window's own deviation from them), and its neighbours'
        #: deviations, squared.
        self.split_lin = 0.0
        self.split_own = 0.0
        self.split_sq = 0.0
        #: The time and token splits' doubt per unit of the members' relative spread, summed
        #: over its spans (own deviation, neighbours'; by time, then by the split's weights),
        #: and in joules as the book last priced it (at close, and again when settled) with
        #: what its spread learnt by then: a spread learnt late counts for its early spans too.
        self.rate_units: list[float] | None = None
        self.rate_own = 0.0
        self.rate_lin = 0.0
        self.power_j = 0.0
        self.measured_s = 0.0
        #: The host's windows in flight (every process's), integrated over ``measured_s``.
        self.host_busy_s = 0.0
        self.lost_s = 0.0  # time that cannot be measured nor filled: the window is unknown
        self.filled_s = 0.0
        self.fill_j = 0.0
        self.fill_unc = 0.0
        self.trouble: str | None = None
        self.basis: str | None = None  # what the filled part was taken from
        #: A span it shared may hold a foreign load nobody could look for yet (None: none
        #: did): it settles once the card was looked at and the node knows its windows'
        #: rate, with what both say was foreign taken off; it teaches the prior nothing.
        self.unwatched: Unwatched | None = None
        self.waiting = 0  # spans waiting on weights that include this window
        self.waits_on: list[Waiting] | None = None  # those spans, while the window is open
        self.seen_end = False
        self.settled = False
        self.abandoned = False
        self.alone = True
        self.rules: str | None = None
        self.error: str | None = None
        self.first: First | None = None
        #: What runs once it settles: one callable as it is, more in a list (:func:`waiting_on`).
        self.callbacks: Callable[[], None] | list[Callable[[], None]] | None = None

    @property
    def seconds(self) -> float:
        return (self.t_close if self.t_close is not None else self.t_open) - self.t_open


@dataclass(eq=False, slots=True)
class Waiting:
    """A span whose split waits for weights that open windows will know at close."""

    span: CardSpan
    above: float
    members: list[tuple[Window, float]]
    open_members: int
    done: bool = False
    idle: float = 0.0  # this book's part of the span's idle floor, shared as ``above`` is


def spread(window: Window, a: float, b: float, value: float, into: list[float]) -> None:
    """Share ``value`` over [a, b] among the window's stages and its tail, by time."""
    if b <= a or window.marks is None:
        return
    prev = window.t_open
    for i, (_, t_mark) in enumerate(window.marks):
        overlap = min(b, t_mark) - max(a, prev)
        if overlap > 0:
            into[i] += value * overlap / (b - a)
        prev = t_mark
    overlap = b - max(a, prev)
    if overlap > 0:
        into[-1] += value * overlap / (b - a)


__all__ = ["First", "Split", "TimeSplit", "TokenSplit", "Waiting", "Window", "spread"]


def waiting_on(window: Window, callback: Callable[[], None]) -> None:
    """Add ``callback`` to what runs once ``window`` settles: the first one as it is (a list
    for every request would be one more object for the cyclic collector), more in a list."""
    callbacks = window.callbacks
    if callbacks is None:
        window.callbacks = callback
    elif isinstance(callbacks, list):
        callbacks.append(callback)
    else:
        window.callbacks = [callbacks, callback]
