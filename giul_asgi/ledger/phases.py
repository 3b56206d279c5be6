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

A window's weight is fixed once its prefill has ended (its mark) or it has closed; spans in
which another member is open and still in prefill wait for it, as spans wait for token counts
under the token split. The first figure (at close) guesses the part not shared yet from the
node's prior, scaled from the node's mean rate to the rate of that part's own phases.

Plain records and arithmetic: no clock, no lock. The book calls it under the ledger's lock.
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

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


@runtime_checkable
class SpanSplit(Split, Protocol):
    """A split whose weights depend on where each member's time falls in the span (not one
    weight per second for the whole window): the book asks it for a span's weights."""

    def weigh(self, span: CardSpan, members: Members, above: float) -> tuple[list[float] | None, str]:
        """Each member's weight in ``span`` (None: by its time in it) and the rule's name for
        the record's ``split``; ``above`` is the energy shared, which the split may learn from."""
        ...

    def first(self, window: Window, first: First) -> First:
        """The first figure's guess of what the card has not shared of the window yet (the
        prior's, at the node's mean rate), at this split's own rates for that part."""
        ...


class _Rates:
    """Span energy ~ r_prefill x prefill-seconds + r_decode x decode-seconds: least squares
    through the origin over sums that decay with the span-seconds added."""

    __slots__ = ("d", "dd", "de", "n", "p", "pd", "pe", "pp")

    def __init__(self) -> None:
        self.n = 0
        self.pp = self.pd = self.dd = self.pe = self.de = 0.0
        self.p = self.d = 0.0  # the seconds themselves: the mix the node's mean rate is of

    def add(self, prefill_s: float, decode_s: float, joules: float, seconds: float) -> None:
        if not (prefill_s + decode_s > 0 and seconds > 0 and math.isfinite(joules)):
            return
        keep = math.exp(-seconds / RATES_TAU_S)
        self.n += 1
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
                     first.filled, f"{first.basis}, at its phases' rates")

    # -- a span's weights -------------------------------------------------------------------
    def weigh(self, span: CardSpan, members: Members, above: float) -> tuple[list[float] | None, str]:
        rates = self.rates.fit()
        if span.tails:  # ramp-down tails after close: by their time
            return None, self.name if rates is not None else "time"
        phases: list[tuple[float, float] | None] = []
        known = 0
        prefill_sum = decode_sum = 0.0
        for window, overlap in members:
            end = window.phase_end
            if end is not None and math.isnan(end) and window.usage is not None:
                end = window.phase_end = self._estimate(window)  # the seconds per token may be known now
            if end is None or math.isnan(end):
                phases.append(None)
                continue
            start = max(window.t_open, span.t0)
            prefill = min(overlap, max(0.0, end - start))
            window.shared_prefill_s += prefill  # the book shares this span now
            phases.append((prefill, overlap - prefill))
            prefill_sum += prefill
            decode_sum += overlap - prefill
            known += 1
        if known == len(members) and not span.unwatched:
            self.rates.add(prefill_sum, decode_sum, above, span.seconds)
            rates = self.rates.fit()
        if rates is None or known == 0:
            return None, "time"
        r_prefill, r_decode = rates
        known_s = prefill_sum + decode_sum
        if known_s <= 0:
            return None, "time"
        mean = (r_prefill * prefill_sum + r_decode * decode_sum) / known_s
        weights = [
            mean * overlap if phase is None else r_prefill * phase[0] + r_decode * phase[1]
            for (_, overlap), phase in zip(members, phases, strict=True)
        ]
        return weights, self.name


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


__all__ = ["MIN_SPANS", "PREFILL", "PhaseSplit", "SpanSplit", "split_for"]
