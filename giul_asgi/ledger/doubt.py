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
rate for the node, or the spread of each span's watts per window-second: a slow change common to
every member (a card warms) all but cancels in it, as it does in the shares (one that follows how
many are in flight does not: a batch whose draw per request falls as it grows, up to a cap, is
read as members' spread, benchmarks/results/simulated_batch-2026-12-07.md); and where the
requests in flight are a fair sample of the mix (a steady batch of
long prompts and long answers), a stretch's members deviate from the node's mean by little in
sum, but whoever joins or leaves still deviates from those beside it. Stretches rather than
spans: one span misses also by how far a counter step's stamp is off (a few ms of the card's
whole draw, idle included), which stays at a stretch's ends while its members' deviations
grow with its length. A closed member's ramp-down tail (about ``ramp_s / 5`` at its rate: the
book's edge doubt) falls in the spans after its close, which the split gives to the others: it
is counted as the closed member's own seconds, so that the misses are left to the rates.

Each contrast also misses by how far its three steps' stamps are off: a step stamped ``d``
off moves ``d`` of the card's whole draw (idle included) across it, a few ms of hundreds of
watts, which is as large as the deviations of members drawing alike (on a virtual clock, 0.05
learnt for 0.017 drawn) and larger than those of a batch of 256 (each member's own joules
below it). The tape says how far each stamp may be off (``stamp_s``): half its bracket before
its line of steps is learnt (a step uniform in it: a third of that squared), the line's
spread after, which held the actual stamp error 31% of the time (0.6-1.4 ms stated for 2.1 ms
actual, virtual clock). What the stamps stray beyond it is learnt from contrasts of single
spans, by the same rule, where the members' part is small (it grows with the cube of a
stretch's length, the stamps' does not), once the stretches' widest spread bound and the
stated doubts are taken off (so a heterogeneous mix's spread leaves less to the stamps, never
more). Both, over the watts across each step, are then taken off the stretches' squared
misses before they are read as the members' spread. What the stamps do over longer times (the
tape's line wanders by a few ms over a second) stays in the stretches' misses, read as
spread: wider than a homogeneous mix needs, never narrower. A contrast whose stretches'
weights differ more than :data:`MAX_RATIO` times is left out (the lighter one's energy, scaled
up, is all its miss).

What is learnt is a variance from a few contrasts: a dozen squared misses can fall well short
of what the next dozen do. The spread used is a one-sided upper bound of it, at the lower
:data:`SHORT` quantile of the contrasts' chi-square (``c^2 = (misses x k / chi2_SHORT(k) -
stamps) / scale``, ``k`` the contrasts counted, forgetting with the span-seconds as the phase
split's fit does), so it starts wide and shrinks as spans teach it, though never above the cold
spread unless the contrasts themselves say more; before :data:`MIN_CONTRASTS`,
:data:`COLD_SPREAD`: a member's rate anywhere between nothing and twice the mean, uniformly
(its sd ``1/sqrt(3)`` of the mean). The long sums forget over minutes, and a mix that turns
unlike after a minute of requests drawing alike was priced at the alike spread for as long (the
old contrasts' scale outweighs the new misses): so what the last :data:`RECENT_CONTRASTS`
contrasts alone say (at the median of their chi-square, :data:`RECENT_SHORT`, up to the cold
spread) is a floor under it, and the mix is priced as unlike from its second round (87% of
settled figures outside for a minute and more before, 9% after with its first round's, a
hostile trial's shape in tests/test_doubt.py). Requests that stay alike keep a recent floor
about as small as the long bound.

The book keeps each window's doubt per unit of spread, span by span, and prices it at the
spread learnt by the window's close (its first figure) and again when it settles: a spread
learnt in a run's second second counts for the first second's spans too (the spread is the
mix's, not the span's). Before, the first seconds of every fresh process were priced cold for
good: a batch of 256 in a 2 s round said 87-95% for requests drawing alike within 3%.

A request's deviation lasts its whole life, and most of its neighbours stay beside it from
span to span: both add up over its spans (the window's ``rate_units``, own and neighbours'); the
two are independent, in quadrature in the figure, each at the normal 90% quantile (:data:`Z90`).
At close, the part of the window not shared yet (the first figure's guess) is the same
request's: its own deviation goes on in it, priced at the same spread and added to the
measured part's (before, it reached the first figure only through the prior's ranked growth,
which keeps a cold start's ranks: a continuous batch of 16 drawing alike said 17% first for
7% settled; now 10%).

Plain records and arithmetic: no clock, no lock. The book calls it under the ledger's lock.
"""

from __future__ import annotations

import math
import operator
from statistics import NormalDist

from ..spans import CardSpan
from .members import Members
from .phases import RATES_TAU_S, Z90

#: Spans in a stretch (on a virtual clock, stretches of 1 and 2 spans of 100 ms learnt a spread
#: of 0.34 and 0.16 for requests drawing alike within +-3%, 4 spans 0.05, 8 too few stretches).
BLOCK_SPANS = 4

#: Before this many contrasts of stretches taught it, a member's doubt takes the cold spread.
MIN_CONTRASTS = 2
#: The members' relative spread before anything is learnt: a rate uniform between nothing
#: and twice the mean.
COLD_SPREAD = 1 / math.sqrt(3)
#: The chance that the spread said is short of what the contrasts' members drew: a 75% upper
#: bound, the member's normal 90% quantile on top (was a 90% bound, which says 1.2-1.6x the
#: spread from 10 to 2 contrasts; at 50%, the 15 W / 45 W mix of tests/test_doubt.py held the
#: truth for 87% of settled figures).
SHORT = 0.25
#: The recent contrasts' memory, in contrasts: what they say is a floor under the long bound,
#: so that a mix that turns unlike is priced so within a few stretches, not once the long sums
#: (RATES_TAU_S of span-seconds) forget the alike one before it (the module). 4 followed the
#: mix sooner but fell short of it more often between rounds (68 of 384 outside against 42,
#: each as its plain estimate); 16 as 8.
RECENT_CONTRASTS = 8.0
#: The recent contrasts' spread is taken at this quantile of their chi-square: their median,
#: not a bound (at SHORT's 25%, the mixed phases' settled figures were 113-150% wide against
#: 99-113%; at the median 107-120%, and the changed mix's 35 of 384 outside against 25).
RECENT_SHORT = 0.5
#: A contrast whose stretches' weights differ more than this many times is left out: the
#: lighter one's energy, its stamps and whatever tail it holds, scaled by the ratio, is all its
#: miss (a single span with 0.2 ms of a member beside a full one, 661x, took a 100 ms
#: counter's stamps for 88 ms and the learnt spread of a 120 W / 30 W mix to nothing).
MAX_RATIO = 4.0
#: A contrast whose members' squared changes of seconds are at most this share of their
#: squared seconds has none (what is left is the sums' rounding).
FLAT = 1e-9


def _sum_into(mine: dict[int, float], seconds: dict[int, float]) -> None:
    """``seconds`` added to ``mine``, key by key. Consecutive spans share few members (those
    running across the step): the rest are taken whole, by C (with the rest of this module's
    set and map arithmetic, the learning's cost a member halved: benchmarks/doubt_cost.py)."""
    both = {key: mine[key] + seconds[key] for key in mine.keys() & seconds.keys()}
    mine.update(seconds)
    mine.update(both)


class _Stretch:
    """Consecutive spans' energy, their weights, and each member's seconds in them."""

    __slots__ = ("_squares", "end_stamp", "energy", "seconds", "span_s", "spans", "start_stamp", "total",
                 "weight", "window_s")

    def __init__(self) -> None:
        self.energy = self.total = self.weight = self.span_s = self.window_s = 0.0
        self.spans = 0
        self.seconds: dict[int, float] = {}  # by member (alive while the stretch is)
        self.start_stamp = self.end_stamp = 0.0  # the tape's stamp doubts at its ends
        self._squares: float | None = None

    @classmethod
    def of_span(cls, span: CardSpan, above: float, members: Members, overlaps: list[float],
                weighed: list[float]) -> _Stretch:
        """One span's stretch (a span's members are distinct windows)."""
        piece = cls()
        piece.start_stamp = piece.end_stamp = span.stamp_s
        piece.span_s = span.seconds
        piece.energy = above
        # The card's whole draw, idle included, in this book's part: a step stamped off
        # moves that much of it between stretches.
        piece.total = span.total_j * span.fraction_of(above)
        piece.weight = sum(weighed)
        piece.spans = 1
        piece.seconds = {id(window): overlap for (window, _), overlap in zip(members, overlaps, strict=True)}
        piece.window_s = sum(overlaps)
        return piece

    def merge(self, other: _Stretch) -> None:
        """The spans of ``other``, which come right after this stretch's, added to it."""
        if not self.spans:
            self.start_stamp = other.start_stamp
        self.end_stamp = other.end_stamp
        self.energy += other.energy
        self.total += other.total
        self.weight += other.weight
        self.span_s += other.span_s
        self.window_s += other.window_s
        self.spans += other.spans
        _sum_into(self.seconds, other.seconds)
        self._squares = None

    def add(self, seconds: dict[int, float], weight: float) -> None:
        """Members' ``seconds`` (and their ``weight``) added to the stretch's."""
        _sum_into(self.seconds, seconds)
        self.window_s += sum(seconds.values())
        self.weight += weight
        self._squares = None

    @property
    def squares(self) -> float:
        """The sum of the members' squared seconds."""
        if self._squares is None:
            values = self.seconds.values()
            self._squares = sum(map(operator.mul, values, values))
        return self._squares

    @property
    def watts(self) -> float:
        return self.total / self.span_s if self.span_s > 0 else 0.0


#: A contrast's terms: its squared miss, the members' scale, the stamps', the stated stamps', and
#: the later stretch's span-seconds (what the sums forget by).
Terms = tuple[float, float, float, float, float]


class _Contrasts:
    """Contrasts of consecutive stretches of one length: their squared misses, the members'
    scale ``sum_j (p x a_j)^2``, the stamps' ``sum (watts across a step)^2`` and what the
    tape's stated stamp doubts make of it, and their count; sums that forget with the
    span-seconds added. ``flat``: whether a contrast in which no member's seconds changed
    (the same windows through both stretches, alike) counts: its miss is the stamps' and a
    common change's alone, which is what the single spans learn the stamps from; among the
    stretches' contrasts, read as the members' spread over a scale of nothing, it made the
    spread of a batch that ran unchanged for seconds 1e7-1e16 (a hostile review)."""

    __slots__ = ("count", "flat", "memory", "miss", "scale", "stamps", "stated")

    def __init__(self, *, flat: bool = True, memory: float | None = None) -> None:
        self.miss = self.scale = self.stamps = self.stated = self.count = 0.0
        self.flat = flat
        #: Forget by contrasts (this many: the recent ones) rather than by span-seconds.
        self.memory = memory

    def add(self, before: _Stretch, now: _Stretch) -> Terms | None:
        """Add the contrast of ``now`` with ``before``; returns its terms (squared miss, scale,
        stamps, stated stamps, ``now``'s span-seconds) for other sums to :meth:`take`, or None
        where it says nothing of rates."""
        # The stretch at the rate of the one before it: what that misses is a contrast of
        # who drew what (a common change of every member's draw cancels in it).
        ratio = now.weight / before.weight
        if not 1 / MAX_RATIO <= ratio <= MAX_RATIO:
            return None  # one stretch's energy scaled many times over: it says nothing of rates
        miss = now.energy - before.energy * ratio
        # sum_j (s_j - ratio x b_j)^2 over both stretches' members, a member absent from one
        # counting nothing there: the squares of each, less what the few in both share.
        seconds, seconds_before = now.seconds, before.seconds
        shared = sum(seconds[j] * seconds_before[j] for j in seconds.keys() & seconds_before.keys())
        whole = now.squares + ratio * ratio * before.squares
        a_sq = max(0.0, whole - 2 * ratio * shared)
        if not self.flat and a_sq <= FLAT * whole:
            return None  # nobody's seconds changed: it says nothing of who drew what
        window_s = now.window_s + before.window_s
        watts = (now.energy + before.energy) / window_s if window_s > 0 else 0.0
        # A step stamped off by d moves d of the card's whole draw across it: at the
        # stretch's end, between the two, at the stretch before's start.
        w_now, w_before = now.watts, ratio * before.watts
        stamps = w_now ** 2 + (w_now + w_before) ** 2 + w_before ** 2
        # The tape's stamp doubt is a bracket's half-width where no line places the step
        # (a step uniform in it: a third of its square), else the line's spread.
        between = max(now.start_stamp, before.end_stamp)
        stated = ((now.end_stamp * w_now) ** 2 + (between * (w_now + w_before)) ** 2
                  + (before.start_stamp * w_before) ** 2) / 3
        terms = (miss * miss, watts * watts * a_sq, stamps, stated, now.span_s)
        self.take(terms)
        return terms

    def take(self, terms: Terms) -> None:
        """Add a contrast's terms (:meth:`add`'s), forgetting the older ones as these sums do."""
        miss_sq, scale, stamps, stated, span_s = terms
        keep = math.exp(-(1 / self.memory if self.memory else span_s / RATES_TAU_S))
        self.miss = self.miss * keep + miss_sq
        self.scale = self.scale * keep + scale
        self.stamps = self.stamps * keep + stamps
        self.stated = self.stated * keep + stated
        self.count = self.count * keep + 1.0


def _chi2(k: float, u: float) -> float:
    """The chi-square quantile at ``u`` for ``k`` degrees (Wilson-Hilferty)."""
    z = NormalDist().inv_cdf(u)
    return max(1e-9, k * (1 - 2 / (9 * k) + z * math.sqrt(2 / (9 * k))) ** 3)


class RateDoubt:
    """The members' spread about a weights-per-second split's one rate, learnt from the
    spans the book shares by it, and each member's doubt from it (see the module)."""

    __slots__ = ("_closed", "_last", "_prev", "_quantile", "_recent", "_spans", "_stretch",
                 "_stretches", "_tau")

    def __init__(self, ramp_s: float = 0.1) -> None:
        # A closed member's ramp-down tail, about ramp_s / 5 at its rate (the book's edges),
        # falls in the spans after its close, which the split gives to the others: a miss of
        # the card's, already in their edge doubt, not a member's rate. Counted as the closed
        # member's own seconds, it leaves the stretches' misses to the rates.
        self._tau = ramp_s / 5
        self._closed: dict[int, tuple[float, float]] = {}  # id: (its close, weight a second)
        self._stretches = _Contrasts(flat=False)  # of stretches of BLOCK_SPANS spans: the members'
        self._recent = _Contrasts(memory=RECENT_CONTRASTS)  # the same contrasts, the last few
        self._spans = _Contrasts()  # of single spans: the stamps'
        self._stretch = _Stretch()
        self._prev: _Stretch | None = None
        self._last: _Stretch | None = None  # the span before, alone
        self._quantile: float | None = None

    def quantile(self) -> float:
        """How far, relative to the rate, 9 members in 10 draw from it: the normal 90%
        quantile of the spread's upper bound (the cold spread's before MIN_CONTRASTS)."""
        if self._quantile is None:
            self._quantile = self._predict()
        return self._quantile

    def stamp_sq(self) -> float:
        """The squared seconds by which a step's stamp strays beyond the tape's stated doubt,
        as the single spans' misses say beyond what the stretches' spread bound and the stated
        doubts explain of them (0: none seen)."""
        spans = self._spans
        if spans.stamps <= 0:
            return 0.0
        spread_sq = self._upper(0.0)  # the widest: what is left for the stamps, the least
        return max(0.0, spans.miss - spread_sq * spans.scale - spans.stated) / spans.stamps

    def learnt(self) -> float | None:
        """The members' relative variance ``c^2`` the stretches say, the stamps' part taken
        off (None: nothing learnt)."""
        stretches = self._stretches
        if stretches.scale <= 0:
            return None
        return max(0.0, stretches.miss - self._stamps(self.stamp_sq())) / stretches.scale

    def _upper(self, stamp_sq: float) -> float:
        """The spread's (``c^2``) upper bound from the stretches, ``stamp_sq`` taken off."""
        stretches = self._stretches
        k = stretches.count
        if k < MIN_CONTRASTS or stretches.scale <= 0:
            return COLD_SPREAD ** 2
        # The squared misses sum to (c^2 x scale + stamps) x chi2_k / k: the c^2 at the
        # chi-square's lower SHORT quantile is the one-sided upper bound of what they say.
        stamps = self._stamps(stamp_sq)
        upper = max(0.0, stretches.miss * k / _chi2(k, SHORT) - stamps) / stretches.scale
        # Few contrasts bound it loosely: never wider than the cold spread for it, unless
        # what they say is itself wider.
        upper = min(upper, max(COLD_SPREAD ** 2, (stretches.miss - stamps) / stretches.scale))
        # And never narrower than what the last few contrasts say, for a mix that changed
        # (their estimate alone, unscaled by their count, left 42 of 384 outside, against 35),
        # up to the cold spread: eight contrasts of a batch drawing alike on a 20 ms counter,
        # the stamps' noise most of their misses, swung from nothing to 10x the cold spread
        # (uncapped, its figures 2-7x as wide, a hostile trial).
        recent = self._recent
        if recent.count >= MIN_CONTRASTS and recent.scale > 0:
            k = recent.count
            stamps = self._stamps(stamp_sq, recent)
            said = (recent.miss * k / _chi2(k, RECENT_SHORT) - stamps) / recent.scale
            upper = max(upper, min(said, COLD_SPREAD ** 2))
        return upper

    def _stamps(self, stamp_sq: float, contrasts: _Contrasts | None = None) -> float:
        """The stamps' expected part of the stretches' squared misses (``contrasts``: of
        those sums; the long ones by default)."""
        sums = contrasts if contrasts is not None else self._stretches
        return stamp_sq * sums.stamps + sums.stated

    def _predict(self) -> float:
        return Z90 * math.sqrt(self._upper(self.stamp_sq()))

    def units(self, span: CardSpan, members: Members, weights: list[float] | None,
              above: float) -> list[tuple[float, float]] | None:
        """Each member's (own, neighbours') doubt in ``span`` per unit of relative spread
        (``weights``: each one's weight in it, None: its overlap), having learnt from it.
        None for ramp-down tails (no member runs in them)."""
        if span.tails:
            self._forget()
            return None
        overlaps = [overlap for _, overlap in members]
        weighed = overlaps if weights is None else weights
        if span.unwatched:
            self._forget()  # a foreign load may be in it: it teaches nothing of members
        else:
            self._learn(span, members, overlaps, weighed, above)
        total_w, total_s = sum(weighed), sum(overlaps)
        if len(members) < 2 or total_w <= 0 or total_s <= 0:
            return [(0.0, 0.0)] * len(members)  # alone: its share is the card's measure
        watts = abs(above) / total_s
        squares = sum(o * o for o in overlaps)
        out = []
        for o, w in zip(overlaps, weighed, strict=True):
            f = w / total_w
            out.append((watts * o * (1 - f), watts * f * math.sqrt(max(0.0, squares - o * o))))
        return out

    def _learn(self, span: CardSpan, members: Members, overlaps: list[float], weighed: list[float],
               above: float) -> None:
        if not (sum(weighed) > 0 and math.isfinite(above)):
            self._forget()
            return
        piece = _Stretch.of_span(span, above, members, overlaps, weighed)
        self._tails(span, members, weighed, piece)
        last, self._last = self._last, piece
        if last is not None and last.weight > 0:
            self._spans.add(last, piece)
            self._quantile = None
        stretch = self._stretch
        stretch.merge(piece)
        if stretch.spans < BLOCK_SPANS:
            return
        prev, self._prev, self._stretch = self._prev, stretch, _Stretch()
        if prev is not None and prev.weight > 0:
            terms = self._stretches.add(prev, stretch)
            if terms is not None:  # the same contrast, in the sums that remember the last few
                self._recent.take(terms)

    def _tails(self, span: CardSpan, members: Members, weighed: list[float], stretch: _Stretch) -> None:
        """Closed members' tails in ``span``, as their seconds in the stretch."""
        closed, tau, t0, t1 = self._closed, self._tau, span.t0, span.t1
        closed.update({id(window): (t_close, weight / overlap)
                       for (window, overlap), weight in zip(members, weighed, strict=True)
                       if (t_close := window.t_close) is not None and t_close < t1 and overlap > 0})
        if not closed or tau <= 0:
            return
        for key in [key for key, (t_close, _) in closed.items() if t0 - t_close > 5 * tau]:
            del closed[key]  # its tail is all but gone
        # tau x (e^(-since/tau) - e^(-(t1 - t_close)/tau)): for a member closed by t0, its
        # tail left at t0 times one factor common to the span.
        fade, exp = 1 - math.exp(-(t1 - t0) / tau), math.exp
        tails = {key: tau * exp((t_close - t0) / tau) * fade if t_close <= t0
                 else tau * (1 - exp((t_close - t1) / tau)) for key, (t_close, _) in closed.items()}
        stretch.add(tails, sum(map(operator.mul, tails.values(), (per_s for _, per_s in closed.values()))))

    def _forget(self) -> None:
        """The spans run on past one that teaches nothing: no stretch spans it."""
        self._stretch = _Stretch()
        self._prev = self._last = None
        self._closed = {}


__all__ = ["COLD_SPREAD", "MIN_CONTRASTS", "SHORT", "RateDoubt"]
