"""How far a share by weights per second can be from what its request caused: the time and
token splits' own doubt, learnt from the spans themselves.

The time split gives each member of a span its overlap's part of the span's energy above idle
(the token split, its part of overlap x tokens per second): a model in which every member draws
``mu x its weight``, one rate for all. A request that draws more than its neighbours (a long
prompt's prefill beside decodes) is charged less than it caused and they more. Rule 5 wants
that in the uncertainty: the truth inside +-uncertainty for at least 9 requests in 10.

Say member i draws ``mu x W_i + D_i`` (``W_i`` its weight in the span: its overlap, or overlap x
tokens per second), where its deviation ``D_i`` is independent of the others' and of typical
size ``c x p x o_i``: ``c`` the members' relative spread, ``p`` the card's watts per window-second,
``o_i`` its time in the span (a second of a request costs about ``p``, whatever the split's weight
says of it: a long prompt with few tokens per second still draws). Its share ``f_i x E`` (``f_i``
its fraction of the weights, ``E`` the span's energy) then misses its truth by::

    f_i x sum_j D_j - D_i  =  -(1 - f_i) D_i  +  f_i x sum_{j != i} D_j

that is ``c x p x o_i x (1 - f_i)`` for its own deviation and ``c x p x f_i x sqrt(sum_{j!=i} o_j^2)``
for its neighbours' (under the time split, ``share x c x sqrt(1 - f)`` together for equal members;
nothing for a member alone in its span: its share is the card's measurement of it).

``c`` is learnt from stretches of :data:`BLOCK_SPANS` consecutive spans, each against the one
before it: stretch k at the rate per weight of stretch k-1 misses by::

    sum_j a_j x D_j / o_j,   a_j = O_j(k) - (W(k) / W(k-1)) x O_j(k-1)

(``O_j`` member j's seconds in a stretch, ``W`` its weights' sum), whose variance is
``c^2 x p^2 x sum_j a_j^2``: ``c^2`` is the ratio of the sums of squared misses over the sums of
``p^2 x sum_j a_j^2``. Why a contrast of neighbouring stretches rather than each span against one
rate for the node, or the spread of each span's watts per window-second: a change common to every
member (a batch's draw per request falls as it grows; a card warms) cancels in it, as it does in
the shares; and where the requests in flight are a fair sample of the mix (a steady batch of
long prompts and long answers), a stretch's members deviate from the node's mean by little in
sum, but whoever joins or leaves still deviates from those beside it. Stretches rather than
spans: one span misses also by how far a counter step's stamp is off (a few ms of the card's
whole draw, idle included), which stays at a stretch's ends while its members' deviations
grow with its length. A closed member's ramp-down tail (about ``ramp_s / 5`` at its rate: the
book's edge doubt) falls in the spans after its close, which the split gives to the others: it
is counted as the closed member's own seconds, so that the misses are left to the rates. What
the card's stamps still add makes ``c`` larger, never smaller: honest, if wider than a
homogeneous mix needs.

What is learnt is a variance from a few stretches: a dozen squared misses can fall well short
of what the next dozen do. The spread used is the one-sided 90% upper bound of it from the
stretches seen (``c^2 x k / chi2_0.10(k)``, ``k`` the stretches counted, forgetting with the
span-seconds as the phase split's fit does), so it starts wide and shrinks as spans teach it,
though never above the cold spread unless the stretches themselves say more; before
:data:`MIN_STRETCHES`, :data:`COLD_SPREAD`: a member's rate anywhere between nothing and twice the
mean, uniformly (its sd ``1/sqrt(3)`` of the mean).

A request's deviation lasts its whole life, and most of its neighbours stay beside it from
span to span: both add up over its spans (the book's ``split_own`` and ``split_lin``); the two are
independent, in quadrature in the figure, each at the normal 90% quantile (:data:`Z90`).

Plain records and arithmetic: no clock, no lock. The book calls it under the ledger's lock.
"""

from __future__ import annotations

import math

from ..spans import CardSpan
from .members import Members
from .phases import RATES_TAU_S, Z90, Doubts

#: Spans in a stretch (on a virtual clock, stretches of 1 and 2 spans of 100 ms learnt a spread
#: of 0.34 and 0.16 for requests drawing alike within +-3%, 4 spans 0.05, 8 too few stretches).
BLOCK_SPANS = 4

#: Before this many stretches taught it, a span's doubt takes the cold spread.
MIN_STRETCHES = 2
#: The members' relative spread before anything is learnt: a rate uniform between nothing
#: and twice the mean.
COLD_SPREAD = 1 / math.sqrt(3)
#: The normal quantile of the lower 10%: the chi-square quantile's Wilson-Hilferty form.
_Z10 = -1.2816


class _Stretch:
    """Consecutive spans' energy, their weights, and each member's seconds in them."""

    __slots__ = ("energy", "seconds", "span_s", "spans", "weight", "window_s")

    def __init__(self) -> None:
        self.energy = self.weight = self.span_s = 0.0
        self.spans = 0
        self.seconds: dict[int, float] = {}  # by member (alive while the stretch is)
        self.window_s = 0.0

    def add(self, span_s: float, above: float, members: Members, weighed: list[float]) -> None:
        self.span_s += span_s
        self.energy += above
        self.weight += sum(weighed)
        self.spans += 1
        mine = self.seconds
        for window, overlap in members:
            mine[id(window)] = mine.get(id(window), 0.0) + overlap
            self.window_s += overlap


class RateDoubt:
    """The members' spread about a weights-per-second split's one rate, learnt from the
    spans the book shares by it, and each member's doubt from it (see the module)."""

    __slots__ = ("_closed", "_miss", "_prev", "_scale", "_stretch", "_stretches", "_tau")

    def __init__(self, ramp_s: float = 0.1) -> None:
        # A closed member's ramp-down tail, about ramp_s / 5 at its rate (the book's edges),
        # falls in the spans after its close, which the split gives to the others: a miss of
        # the card's, already in their edge doubt, not a member's rate. Counted as the closed
        # member's own seconds, it leaves the stretches' misses to the rates.
        self._tau = ramp_s / 5
        self._closed: dict[int, tuple[float, float]] = {}  # id: (its close, weight a second)
        # Stretches' squared misses, their sum_j (p x a_j)^2, and their count: sums that
        # forget with the span-seconds added.
        self._miss = self._scale = self._stretches = 0.0
        self._stretch = _Stretch()
        self._prev: _Stretch | None = None

    def spread(self) -> float:
        """The members' relative spread to say (``c``): the learnt one's 90% upper bound, or
        the cold one before :data:`MIN_STRETCHES` stretches."""
        k = self._stretches
        c2 = self.learnt()
        if k < MIN_STRETCHES or c2 is None:
            return COLD_SPREAD
        chi2 = k * (1 - 2 / (9 * k) + _Z10 * math.sqrt(2 / (9 * k))) ** 3
        # Few stretches bound it loosely: never wider than the cold spread for it, unless
        # what they say is itself wider.
        return min(math.sqrt(c2 * k / chi2), max(COLD_SPREAD, math.sqrt(c2)))

    def learnt(self) -> float | None:
        """The members' relative variance ``c^2`` the stretches say (None: nothing learnt)."""
        return self._miss / self._scale if self._scale > 0 else None

    def doubts(self, span: CardSpan, members: Members, weights: list[float] | None,
               above: float) -> Doubts | None:
        """Each member's doubt in ``span`` (``weights``: each one's weight in it, None: its
        overlap), having learnt from it. None for ramp-down tails (no member runs in them)."""
        if span.tails:
            self._forget()
            return None
        overlaps = [overlap for _, overlap in members]
        weighed = overlaps if weights is None else weights
        if span.unwatched:
            self._forget()  # a foreign load may be in it: it teaches nothing of members
        else:
            self._learn(span, members, weighed, above)
        total_w, total_s = sum(weighed), sum(overlaps)
        if len(members) < 2 or total_w <= 0 or total_s <= 0:
            return [(0.0, 0.0, 0.0)] * len(members)  # alone: its share is the card's measure
        c = Z90 * self.spread()
        watts = abs(above) / total_s
        squares = sum(o * o for o in overlaps)
        out: Doubts = []
        for o, w in zip(overlaps, weighed, strict=True):
            f = w / total_w
            own = c * watts * o * (1 - f)
            others = c * watts * f * math.sqrt(max(0.0, squares - o * o))
            out.append((others, own, 0.0))
        return out

    def _learn(self, span: CardSpan, members: Members, weighed: list[float], above: float) -> None:
        if not (sum(weighed) > 0 and math.isfinite(above)):
            self._forget()
            return
        stretch = self._stretch
        stretch.add(span.seconds, above, members, weighed)
        self._tails(span, members, weighed, stretch)
        if stretch.spans < BLOCK_SPANS:
            return
        prev, self._prev, self._stretch = self._prev, stretch, _Stretch()
        if prev is None or prev.weight <= 0:
            return
        # The stretch at the rate of the one before it: what that misses is a contrast of
        # who drew what (a common change of every member's draw cancels in it).
        ratio = stretch.weight / prev.weight
        miss = stretch.energy - prev.energy * ratio
        now, before = stretch.seconds, prev.seconds
        a_sq = sum((now.get(j, 0.0) - ratio * before.get(j, 0.0)) ** 2 for j in now.keys() | before.keys())
        window_s = stretch.window_s + prev.window_s
        watts = (stretch.energy + prev.energy) / window_s if window_s > 0 else 0.0
        scale = watts * watts * a_sq
        if scale > 0:
            keep = math.exp(-stretch.span_s / RATES_TAU_S)
            self._miss = self._miss * keep + miss * miss
            self._scale = self._scale * keep + scale
            self._stretches = self._stretches * keep + 1.0

    def _tails(self, span: CardSpan, members: Members, weighed: list[float], stretch: _Stretch) -> None:
        """Closed members' tails in ``span``, as their seconds in the stretch."""
        closed, tau = self._closed, self._tau
        for (window, overlap), weight in zip(members, weighed, strict=True):
            t_close = window.t_close
            if t_close is not None and t_close < span.t1 and overlap > 0:
                closed[id(window)] = (t_close, weight / overlap)
        if not closed or tau <= 0:
            return
        for key, (t_close, per_s) in list(closed.items()):
            if span.t0 - t_close > 5 * tau:
                del closed[key]  # its tail is all but gone
                continue
            since = max(0.0, span.t0 - t_close)
            tail_s = tau * (math.exp(-since / tau) - math.exp(-(span.t1 - t_close) / tau))
            stretch.seconds[key] = stretch.seconds.get(key, 0.0) + tail_s
            stretch.window_s += tail_s
            stretch.weight += tail_s * per_s

    def _forget(self) -> None:
        """The spans run on past one that teaches nothing: no stretch spans it."""
        self._stretch = _Stretch()
        self._prev = None
        self._closed = {}


__all__ = ["COLD_SPREAD", "MIN_STRETCHES", "RateDoubt"]
