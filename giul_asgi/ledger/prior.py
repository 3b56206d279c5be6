"""What fills the part of a window the card has not reported: the node's prior.

A counter reports energy a period late, and not at all before its first step or while its
reader fails. Both figures a window gets come from one model: what the card reported, plus
the rest at the node's *prior*, the joules per window-second it recently charged:

- the **run rate**, where windows ran whole spans (their draw, a ramp-down tail added apart),
  else the rate settled windows were charged (tails inside it), else recent spans' rate,
  else (nothing learnt yet: a ledger that just started) the window's own measured rate,
  else the card's above-idle power in its first readings (windows that closed before the
  counter's first step);
- a **bias** and a **spread** learnt from how far earlier first figures' guesses fell from
  what their windows settled at, in units of the guess (split conformal: the spread is the
  rank that covers ``COVER`` of them; before there are enough, the whole guess);
- how much the measured part's own doubt grew between close and settling.

The same rate and spread fill time that no reading will ever cover (before the tape's first
step, a gap where the reader failed): that part is an estimate, never booked as measured.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .window import First, Window

#: Windows settled so far teach the prior with this weight each (an EWMA).
PRIOR_WEIGHT = 0.1
#: Residuals of first figures kept for the bias and spread of the interpolated part.
RESIDUALS = 256
#: The share of first figures whose interpolated part the uncertainty covers: the
#: conformal rank ceil((n + 1) x COVER) of n past residuals, once there are enough of them;
#: before that, the part is uncertain by its whole scale.
COVER = 0.92
COLD_SPREAD = 1.0
#: And never less than this share of the interpolated part itself.
FLOOR = 0.05
#: Span rates teach the prior with a weight of 1 - exp(-window-seconds / this).
RATE_TAU_S = 5.0


@dataclass(frozen=True, slots=True)
class Fill:
    """An interpolated part: its joules, its uncertainty, and what it was taken from."""

    joules: float
    uncertainty: float
    rate: float
    basis: str


class Prior:
    """The node's joules per window-second, and how far guesses made from it fall."""

    def __init__(self, ramp_s: float, period: Callable[[], float]) -> None:
        self.ramp_s = ramp_s
        self.period = period
        self._prior: float | None = None  # J per window-second of settled windows
        self._span_rate: float | None = None  # J per window-second of recent shared spans
        self._run_rate: float | None = None  # the same, in spans windows covered whole
        self._card_w: float | None = None  # above-idle watts of spans no window was in
        self._settled = 0
        self._residuals: deque[float] = deque(maxlen=RESIDUALS)
        self._growth: deque[float] = deque(maxlen=RESIDUALS)  # settled doubt added after close
        # The ranks of both, computed once after they change rather than at every figure
        # (two sorts of 256 per figure were most of a window's open and close: A/B 3.9 ->
        # 1.6 us in benchmarks/overhead.py's breakdown).
        self._ranks: tuple[float, float, float] | None = None

    # -- learning -------------------------------------------------------------------------
    def learn_span(
        self, rate: float, covered: float, seconds: float, members: list[tuple[Window, float]]
    ) -> None:
        """A shared span's joules per window-second; where windows ran it whole (no edge,
        no tail in it), also the run rate."""
        weight = 1.0 - math.exp(-covered / RATE_TAU_S)
        span_rate = self._span_rate
        self._span_rate = rate if span_rate is None else span_rate + weight * (rate - span_rate)
        if all(overlap >= seconds * (1 - 1e-9) for _, overlap in members):
            run = self._run_rate
            self._run_rate = rate if run is None else run + weight * (rate - run)

    def learn_card(self, watts: float) -> None:
        """A span no window was in: the card's above-idle power then. The last resort of
        a ledger that has learnt nothing else (its first windows closed before its first
        counter step), so that they settle at once rather than wait for a rate."""
        card = self._card_w
        watts = max(0.0, watts)
        self._card_w = watts if card is None else card + 0.5 * (watts - card)

    def learn_settled(self, window: Window, measured_unc: float) -> None:
        """A window settled wholly measured: its rate, and how far its first guess fell."""
        seconds = window.seconds
        if seconds > 0:
            rate = window.share / seconds
            self._settled += 1
            weight = max(PRIOR_WEIGHT, 1.0 / self._settled)
            self._prior = rate if self._prior is None else self._prior + weight * (rate - self._prior)
        first = window.first
        if first is not None and first.scale > 0:
            actual = window.share - first.reported
            self._residuals.append((actual - first.guess) / first.scale)
            self._growth.append(max(0.0, measured_unc - first.unc) / first.scale)
            self._ranks = None

    # -- guessing -------------------------------------------------------------------------
    def rate(self, window: Window, alone: bool) -> tuple[float | None, float, str]:
        """(joules per second, tail seconds to add, what the rate is) for this window."""
        if self._run_rate is not None:
            return self._run_rate, (self.ramp_s / 5 if alone else 0.0), "the node's prior"
        if self._prior is not None:
            return self._prior, 0.0, "the node's prior"
        if self._span_rate is not None:
            return self._span_rate, 0.0, "the node's first spans"
        if window.measured_s > 0 and window.share > 0:
            return window.share / window.measured_s, 0.0, "the window's own measured rate"
        if self._card_w:
            return self._card_w, 0.0, "the card's power in its first readings"
        return None, 0.0, "nothing yet"

    def first_guess(self, window: Window, alone: bool, measured_unc: float) -> First | None:
        """What the first figure assumes about the part of the window not shared yet: its
        time not yet shared (not reported, or waiting for weights) at the prior, plus, if
        it closes alone, its ramp-down tail (about ``ramp_s / 5`` seconds at that rate:
        ``ramp_s`` is when the tail has all but gone)."""
        unshared = max(0.0, window.seconds - window.measured_s - window.lost_s - window.filled_s)
        rate, tail, basis = self.rate(window, alone)
        if rate is None or rate <= 0:
            return None
        # The residual's unit is the guess itself, with at least a quarter period of time
        # in it: a window closing just after a step still waits on how the next one falls.
        return First(
            window.share, rate * (unshared + tail), rate * max(unshared + tail, self.period() / 4),
            measured_unc, window.filled_s, basis,
        )

    def fill(self, window: Window, alone: bool) -> Fill | None:
        """The window's time no reading will cover (``filled_s``), at the prior, with the
        same learnt bias and spread as a first figure's guess; None when nothing is known."""
        rate, _, basis = self.rate(window, alone)
        if rate is None or rate <= 0:
            return None
        guess = rate * window.filled_s
        scale = rate * max(window.filled_s, self.period() / 4)
        bias, spread = self.bias_spread()
        joules = max(0.0, guess + bias * scale)
        return Fill(joules, spread * scale + FLOOR * joules, rate, basis)

    def growth_at(self) -> float:
        """How much the measured part's uncertainty grew from close to settling, per unit
        of scale, for COVER of past windows (0 before there are enough)."""
        return self._learnt()[2]

    def bias_spread(self) -> tuple[float, float]:
        """The learnt bias of first figures' interpolated parts (their median residual) and
        the spread about it that covers COVER of them (split conformal)."""
        bias, spread, _ = self._learnt()
        return bias, spread

    def _learnt(self) -> tuple[float, float, float]:
        ranks = self._ranks
        if ranks is None:
            self._ranks = ranks = (*_bias_spread(self._residuals), _rank(self._growth))
        return ranks


def _rank(values: deque[float]) -> float:
    rank = math.ceil((len(values) + 1) * COVER)
    return sorted(values)[rank - 1] if rank <= len(values) else 0.0


def _bias_spread(residuals: deque[float]) -> tuple[float, float]:
    n = len(residuals)
    rank = math.ceil((n + 1) * COVER)
    if rank > n:
        return 0.0, COLD_SPREAD
    ordered = sorted(residuals)
    bias = ordered[n // 2]
    return bias, sorted(abs(r - bias) for r in ordered)[rank - 1]


__all__ = ["COLD_SPREAD", "COVER", "FLOOR", "Fill", "Prior"]
