"""Prefill and decode weighed at their own rates: the ``phases`` split.

Under continuous batching a request's prefill is compute-bound (the card draws hard while it
runs) and its decode memory-bound (it draws less), so a long prompt with a short answer costs
unlike a short prompt with a long answer of the same length. The time split charges both
alike; the token split weighs tokens per second, which says nothing of the prompt. This split
gives each member of a span the weight::

    r_prefill x its prefill-seconds in the span  +  r_decode x its decode-seconds in it

and the book shares the span by those weights, so the span is still shared whole: weights only
redistribute it, and ``charged + unattributed == measured above idle`` holds as for any split.

Where a window's prefill ends, first found that holds:

- its ``prefill`` mark (:data:`PREFILL`): the SSE responder makes it when an OpenAI chat
  stream's first event goes out (a server sends it with the first token), and a handler may
  make it itself (``meter.mark("prefill")``);
- else its token counts (prompt and completion, from ``usage``) at the node's seconds per
  prompt token and per completion token: the upstream's own where it says them (vLLM's
  ``vllm:request_prefill_time_seconds`` and ``_decode_time_seconds`` sums over its prompt and
  generation token counters), else those of this node's marked windows; the window's time is
  cut where that proportion puts the end of its prefill;
- else nowhere: the window weighs the mean rate of the span's other members (its time only).

The two rates are learnt per node from the spans it shares, each span once, when every member's
phases are known: a least-squares fit of the span's energy against its members' prefill- and
decode-seconds, over sums that decay with the span-seconds added (the prior's ratio-of-sums
habit: a long span teaches more than a sliver). Until the fit stands (enough spans, prefill and
decode not in one fixed proportion across them, both rates positive) a span is shared by time
and its windows say ``time``; after, ``phases``.

What the split cannot know is in each share's uncertainty (rule 5: the truth inside it for at
least 9 requests in 10), independent of the card's own doubts and so in quadrature with them:

- while the fit does not stand, a span shared by time could be any share between the one at
  prefill-only rates and the one at decode-only rates (both rates only known to be >= 0): the
  doubt is the farther of the two from the time share;
- once it stands, the fit's own error (the ratio of the two rates, from the spans' residuals:
  least squares' covariance) moves each share by its derivative in that ratio; and each
  request draws off the node's rates by its own amount (its prompt, its batch, its clocks),
  whose spread the residuals tell: a stretch of spans whose members deviate independently
  misses its prediction by sigma x sqrt(sum of each member's squared weight in it), so sigma^2
  is the ratio of sums of squared misses over those sums, over stretches of
  :data:`BLOCK_SPANS` spans (one span alone misses by what the card's step and a ramp move
  between neighbours, which a request's own figure does not; each span is predicted by the fit
  before it taught it). A share of fraction f moves by sigma x (1 - f) for its own deviation
  and by sigma x sqrt(sum of the others' f^2) for theirs.

The rates' error and a request's own deviation last its whole life: they add up over its
spans; its neighbours' change as they come and go: in quadrature. The three are independent
of one another (in quadrature in the figure), each at the normal 90% quantile (:data:`Z90`).

A window's weight is fixed once its prefill has ended (its mark) or it has closed; spans in
which another member is open and still in prefill wait for it, as spans wait for token counts
under the token split. The first figure (at close) guesses the part not shared yet from the
node's prior, scaled from the node's mean rate to the rate of that part's own phases.

Plain records and arithmetic: no clock, no lock. The book calls it under the ledger's lock.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Protocol, runtime_checkable

from ..spans import CardSpan
from .members import Members
from .window import First, Split, TimeSplit, TokenSplit, Window

#: The mark that ends a window's prefill.
PREFILL = "prefill"
#: The fit of the rates stands once this many spans taught it...
MIN_SPANS = 12
#: ... and prefill- and decode-seconds across them are this far from one fixed proportion
#: (1 - cos^2 of the angle between the two columns of the fit: 0 when they are proportional).
MIN_SPREAD = 0.02
#: The fit's sums forget with this time constant, in span-seconds taught.
RATES_TAU_S = 120.0
#: Seconds per token forget with this time constant, in window-seconds taught.
PER_TOKEN_TAU_S = 60.0
#: The normal quantile that leaves 5% on either side: each split doubt covers 90% of truths.
Z90 = 1.645
#: A member's deviation is learnt over stretches of this many consecutive spans.
BLOCK_SPANS = 4


@runtime_checkable
class SpanSplit(Split, Protocol):
    """A split whose weights depend on where each member's time falls in the span (not one
    weight per second for the whole window): the book asks it for a span's weights."""

    def weigh(self, span: CardSpan, members: Members, above: float) -> Weighed:
        """Each member's weight in ``span`` (None: by its time in it), the rule's name for the
        record's ``split``, and each member's doubt in joules from the split itself (None:
        none); ``above`` is the energy shared, which the split may learn from."""
        ...

    def time_doubts(self, span: CardSpan, members: Members, above: float) -> Doubts | None:
        """Each member's doubt in joules where the book shares ``span`` by time (a span that
        waited too long for a weight)."""
        ...

    def first(self, window: Window, first: First) -> First:
        """The first figure's guess of what the card has not shared of the window yet (the
        prior's, at the node's mean rate), at this split's own rates for that part."""
        ...


#: Each member's split doubt in a span, in joules: (the rates' error, its own deviation from
#: them: each adds up over the spans of its life; its neighbours', squared: in quadrature).
#: The three are independent: the figure's doubt takes them in quadrature.
Doubts = list[tuple[float, float, float]]


class Weighed(NamedTuple):
    """A span's weights (None: by time), the rule's name, and each member's split doubt."""

    weights: list[float] | None
    rule: str
    doubts: Doubts | None = None


class _Rates:
    """Span energy ~ r_prefill x prefill-seconds + r_decode x decode-seconds: least squares
    through the origin over sums that decay with the span-seconds added; with the sums that
    say how far the fit and a member may be off (see the module)."""

    __slots__ = ("d", "dd", "de", "ee", "herf", "miss", "n", "p", "pd", "pe", "pp", "w")

    def __init__(self) -> None:
        self.n = 0
        self.pp = self.pd = self.dd = self.pe = self.de = 0.0
        self.p = self.d = 0.0  # the seconds themselves: the mix the node's mean rate is of
        self.ee = self.w = 0.0  # squared energies and the spans' count: the fit's residual
        self.miss = self.herf = 0.0  # squared misses of predictions, squared-weight sums

    def add(self, prefill_s: float, decode_s: float, joules: float, seconds: float) -> None:
        if not (prefill_s + decode_s > 0 and seconds > 0 and math.isfinite(joules)):
            return
        keep = math.exp(-seconds / RATES_TAU_S)
        self.n += 1
        self.ee = self.ee * keep + joules * joules
        self.w = self.w * keep + 1.0
        self.pp = self.pp * keep + prefill_s * prefill_s
        self.pd = self.pd * keep + prefill_s * decode_s
        self.dd = self.dd * keep + decode_s * decode_s
        self.pe = self.pe * keep + prefill_s * joules
        self.de = self.de * keep + decode_s * joules
        self.p = self.p * keep + prefill_s
        self.d = self.d * keep + decode_s

    def fit(self) -> tuple[float, float] | None:
        """(watts a window draws in prefill, in decode), once the fit stands; else None."""
        if self.n < MIN_SPANS or self.pp <= 0 or self.dd <= 0:
            return None
        det = self.pp * self.dd - self.pd * self.pd
        if det <= MIN_SPREAD * self.pp * self.dd:
            return None  # prefill and decode always in one proportion: their rates cannot be told
        prefill = (self.pe * self.dd - self.de * self.pd) / det
        decode = (self.de * self.pp - self.pe * self.pd) / det
        if prefill <= 0 or decode <= 0:
            return None
        return prefill, decode

    def mean(self, rates: tuple[float, float]) -> float:
        """The rate of a second of the mix the node served (what the prior's rates are)."""
        return (rates[0] * self.p + rates[1] * self.d) / (self.p + self.d)

    def log_ratio_sd(self, rates: tuple[float, float]) -> float:
        """The standard error of log(r_prefill / r_decode): least squares' covariance, from
        the residual of the spans the fit was made of."""
        a, b = rates
        det = self.pp * self.dd - self.pd * self.pd
        rss = self.ee - 2 * (a * self.pe + b * self.de) + a * a * self.pp + 2 * a * b * self.pd \
            + b * b * self.dd
        sigma2 = max(0.0, rss) / max(self.w - 2.0, 1.0)
        var = sigma2 / det * (self.dd / (a * a) + self.pp / (b * b) + 2 * self.pd / (a * b))
        return math.sqrt(max(0.0, var))

    def add_miss(self, miss_sq: float, weights_sq: float, seconds: float) -> None:
        """A stretch's squared miss of its prediction and its members' squared weights."""
        if math.isfinite(miss_sq) and weights_sq > 0:
            keep = math.exp(-seconds / RATES_TAU_S)
            self.miss = self.miss * keep + miss_sq
            self.herf = self.herf * keep + weights_sq

    def member_sd(self) -> float | None:
        """How far one member draws off the fit's rates, relative (None: nothing seen yet)."""
        if self.herf <= 0:
            return None
        return math.sqrt(self.miss / self.herf)


class _PerToken:
    """Seconds per prompt token in prefill and per completion token in decode: ratios of
    sums decaying with the seconds added."""

    __slots__ = ("completion", "decode_s", "prefill_s", "prompt")

    def __init__(self) -> None:
        self.prefill_s = self.prompt = self.decode_s = self.completion = 0.0

    def add(self, prefill_s: float, prompt: float, decode_s: float, completion: float) -> None:
        if prefill_s > 0 and prompt > 0:
            keep = math.exp(-prefill_s / PER_TOKEN_TAU_S)
            self.prefill_s = self.prefill_s * keep + prefill_s
            self.prompt = self.prompt * keep + prompt
        if decode_s > 0 and completion > 0:
            keep = math.exp(-decode_s / PER_TOKEN_TAU_S)
            self.decode_s = self.decode_s * keep + decode_s
            self.completion = self.completion * keep + completion

    def seconds(self) -> tuple[float, float] | None:
        """(seconds per prompt token, per completion token), once both are known."""
        if self.prompt <= 0 or self.completion <= 0:
            return None
        return self.prefill_s / self.prompt, self.decode_s / self.completion


class _Stretch:
    """Consecutive fully known spans: their energy, its prediction, each member's weight."""

    __slots__ = ("above", "predicted", "seconds", "spans", "weights")

    def __init__(self) -> None:
        self.above = self.predicted = self.seconds = 0.0
        self.spans = 0
        self.weights: dict[int, float] = {}

    def add(self, above: float, seconds: float, members: Members, weights: list[float]) -> None:
        self.above += above
        self.seconds += seconds
        self.spans += 1
        self.predicted += sum(weights)
        mine = self.weights
        for (window, _), weight in zip(members, weights, strict=True):
            mine[id(window)] = mine.get(id(window), 0.0) + weight  # alive while the stretch is


class PhaseSplit:
    """Shares a span by each member's prefill- and decode-seconds in it, at rates learnt on
    the node (see the module). A window's weight is known once its prefill has ended (its
    mark) or it has closed: until then the spans it is in wait for it, as for the token split."""

    name = "phases"
    known_at_open = False

    def __init__(self) -> None:
        self.rates = _Rates()
        self._own = _PerToken()  # this node's marked windows
        self._engine = _PerToken()  # the upstream's own phase times and token counters
        self._engine_last: tuple[float, float, float, float] | None = None
        self._stretch = _Stretch()

    # -- a window's phases ------------------------------------------------------------------
    def weight(self, window: Window) -> float | None:
        """1.0 once the window's phases are fixed (its prefill mark, or its close, where the
        book asks once); None while it is open and in prefill. Its weight in a span is
        :meth:`weigh`'s."""
        if window.phase_end is None:
            end = _marked(window)
            if end is None:
                if window.t_close is None:
                    return None
                end = self._estimate(window)
            window.phase_end = end
        if window.t_close is not None:
            self._learn_own(window)
        return 1.0

    def _estimate(self, window: Window) -> float:
        """Where an unmarked window's prefill ended, from its token counts (NaN: unknown)."""
        usage = window.usage
        per = self._engine.seconds() or self._own.seconds()
        if usage is None or per is None or window.t_close is None:
            return math.nan
        prefill, decode = usage[0] * per[0], usage[1] * per[1]
        if prefill + decode <= 0:
            return math.nan
        return window.t_open + (window.t_close - window.t_open) * prefill / (prefill + decode)

    def _learn_own(self, window: Window) -> None:
        """A marked window closed with its token counts: its seconds per token of each phase."""
        usage, end = window.usage, _marked(window)
        if usage is None or end is None or window.t_close is None:
            return
        self._own.add(end - window.t_open, usage[0], window.t_close - end, usage[1])

    def note_engine(self, prompt_tokens: float | None, generation_tokens: float | None,
                    prefill_s: float | None, decode_s: float | None) -> None:
        """The upstream's cumulative prompt and generation tokens and its requests' summed
        prefill and decode seconds: their increments refine the seconds per token."""
        if None in (prompt_tokens, generation_tokens, prefill_s, decode_s):
            return
        now = (float(prompt_tokens), float(generation_tokens), float(prefill_s), float(decode_s))  # type: ignore[arg-type]
        last, self._engine_last = self._engine_last, now
        if last is None:
            return
        d = [b - a for a, b in zip(last, now, strict=True)]
        if min(d) < 0:
            return  # the server restarted: its counters began again
        self._engine.add(d[2], d[0], d[3], d[1])

    def first(self, window: Window, first: First) -> First:
        rates = self.rates.fit()
        end = window.phase_end
        unshared = max(0.0, window.seconds - window.measured_s - window.lost_s - window.filled_s)
        if rates is None or end is None or math.isnan(end) or unshared <= 0 or first.guess <= 0:
            return first
        # What of its prefill the shared spans did not hold is in the part not shared yet.
        prefill = min(unshared, max(0.0, end - window.t_open - window.shared_prefill_s))
        rate = (rates[0] * prefill + rates[1] * (unshared - prefill)) / unshared
        factor = rate / self.rates.mean(rates)
        return First(first.reported, first.guess * factor, first.scale * factor, first.unc,
                     first.filled, f"{first.basis}, at its phases' rates", first.draining)

    # -- a span's weights -------------------------------------------------------------------
    def weigh(self, span: CardSpan, members: Members, above: float) -> Weighed:
        before = rates = self.rates.fit()
        if span.tails:  # ramp-down tails after close: by their time
            return Weighed(None, self.name if rates is not None else "time")
        phases = self._phases(span, members)
        prefill_sum = decode_sum = 0.0
        for (window, _), phase in zip(members, phases, strict=True):
            if phase is not None:
                window.shared_prefill_s += phase[0]  # the book shares this span now
                prefill_sum += phase[0]
                decode_sum += phase[1]
        known = sum(1 for phase in phases if phase is not None)
        if known == len(members) and not span.unwatched:
            if before is not None:  # how far this span falls from the fit that did not see it
                self._learn_miss(span, members, phases, above, before)
            self.rates.add(prefill_sum, decode_sum, above, span.seconds)
            rates = self.rates.fit()
        else:
            self._stretch = _Stretch()
        if rates is None or known == 0 or prefill_sum + decode_sum <= 0:
            return Weighed(None, "time", self._bracket(members, phases, above))
        r_prefill, r_decode = rates
        mean = (r_prefill * prefill_sum + r_decode * decode_sum) / (prefill_sum + decode_sum)
        weights = [
            mean * overlap if phase is None else r_prefill * phase[0] + r_decode * phase[1]
            for (_, overlap), phase in zip(members, phases, strict=True)
        ]
        return Weighed(weights, self.name, self._doubts(phases, weights, above, rates, mean))

    def _learn_miss(self, span: CardSpan, members: Members, phases: list[tuple[float, float] | None],
                    above: float, rates: tuple[float, float]) -> None:
        stretch = self._stretch
        stretch.add(above, span.seconds, members,
                    [rates[0] * p + rates[1] * d for p, d in phases])  # type: ignore[misc]
        if stretch.spans >= BLOCK_SPANS:
            self.rates.add_miss((stretch.above - stretch.predicted) ** 2,
                                sum(w * w for w in stretch.weights.values()), stretch.seconds)
            self._stretch = _Stretch()

    def time_doubts(self, span: CardSpan, members: Members, above: float) -> Doubts | None:
        if span.tails:
            return None
        return self._bracket(members, self._phases(span, members), above)

    def _phases(self, span: CardSpan, members: Members) -> list[tuple[float, float] | None]:
        """Each member's (prefill, decode) seconds in ``span``; None where not known."""
        out: list[tuple[float, float] | None] = []
        for window, overlap in members:
            end = window.phase_end
            if end is not None and math.isnan(end) and window.usage is not None:
                end = window.phase_end = self._estimate(window)  # the seconds per token may be known now
            if end is None or math.isnan(end):
                out.append(None)
                continue
            prefill = min(overlap, max(0.0, end - max(window.t_open, span.t0)))
            out.append((prefill, overlap - prefill))
        return out

    def _bracket(self, members: Members, phases: list[tuple[float, float] | None],
                 above: float) -> Doubts:
        """Each member's doubt where the span is shared by time with rates not known: the
        farther of its shares at prefill-only and decode-only rates (an unknown member's
        phases could be either: half each in the sums, its whole share its doubt)."""
        halves = [(o / 2, o / 2) if ph is None else ph for (_, o), ph in zip(members, phases, strict=True)]
        total_p = sum(p for p, _ in halves)
        total_d = sum(d for _, d in halves)
        total = total_p + total_d
        out = []
        for (_, overlap), phase, (p, d) in zip(members, phases, halves, strict=True):
            share = above * overlap / total if total > 0 else 0.0
            if phase is None:
                out.append((abs(share), 0.0, 0.0))
                continue
            high = above * p / total_p if total_p > 0 else share
            low = above * d / total_d if total_d > 0 else share
            out.append((max(abs(high - share), abs(low - share)), 0.0, 0.0))
        return out

    def _doubts(self, phases: list[tuple[float, float] | None], weights: list[float], above: float,
                rates: tuple[float, float], mean: float) -> Doubts:
        """Each member's doubt at the fit's rates (see the module): the ratio's own error and
        the member's own deviation add up over its spans; the others' deviations, which
        change as members come and go, in quadrature."""
        total = sum(weights)
        if total <= 0:
            return [(0.0, 0.0, 0.0)] * len(weights)
        a, b = rates
        ratio_sd = self.rates.log_ratio_sd(rates)
        member_sd = self.rates.member_sd()
        fractions = [w / total for w in weights]
        herf = sum(f * f for f in fractions)
        total_p = sum(ph[0] for ph in phases if ph is not None)
        total_d = sum(ph[1] for ph in phases if ph is not None)
        denominator = (a * total_p + b * total_d) ** 2
        out = []
        for phase, f in zip(phases, fractions, strict=True):
            share = abs(above) * f
            if phase is None:  # its phases unknown: anywhere between the two rates
                out.append((share * max(a / mean - 1.0, 1.0 - b / mean), 0.0, 0.0))
                continue
            rates_j = 0.0
            if denominator > 0:  # d share / d log(a / b)
                rates_j = Z90 * ratio_sd * abs(above) * a * b \
                    * abs(phase[0] * total_d - total_p * phase[1]) / denominator
            if member_sd is None:
                out.append((rates_j, share, 0.0))  # nothing seen yet of how far members fall off
                continue
            own = Z90 * member_sd * share
            out.append((rates_j, own * (1 - f), own * own * max(0.0, herf - f * f)))
        return out


def _marked(window: Window) -> float | None:
    """When the window's prefill mark was made (within the window), or None."""
    for name, t in window.marks or ():
        if name == PREFILL:
            end = t if window.t_close is None else min(t, window.t_close)
            return max(window.t_open, end)
    return None


def split_for(name: str) -> Split:
    """The split a node's ``split`` names (checked by :class:`~giul_asgi.config.Node`)."""
    if name == "tokens":
        return TokenSplit()
    if name == "phases":
        return PhaseSplit()
    return TimeSplit()


__all__ = [
    "BLOCK_SPANS", "MIN_SPANS", "PREFILL", "Z90", "Doubts", "PhaseSplit", "SpanSplit", "Weighed", "split_for",
]
