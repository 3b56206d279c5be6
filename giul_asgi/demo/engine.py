"""A continuous-batching engine that takes the time a real one does and loads a simulated card.

One asyncio task steps the batch, as vLLM's engine loop does: at each step the waiting
sequences join (their prompts are prefilled in that step, which makes it longer), every
running sequence gets one token, and finished ones leave. A step takes longer as the batch
grows, so a request's latency depends on what runs beside it. While sequences run, each
puts an equal share of :func:`batch_watts` on the card, so the card's draw grows with the
batch, sublinearly, up to its cap; the energy the gateway reads is caused by the requests it
meters, and shared among them as the card shares it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from ..readers.simulated import Job, SimulatedCard, batch_watts


@dataclass(frozen=True, slots=True)
class Speed:
    """How fast a simulated model runs on its card, and what it draws there."""

    #: Seconds of a decode step with one sequence in the batch.
    step_s: float = 0.012
    #: Seconds each further sequence adds to a step.
    step_s_per_seq: float = 0.0008
    #: Seconds per prompt token prefilled in a step.
    prefill_s_per_token: float = 0.00005
    #: Above-idle watts of a batch of one; a batch of n draws ``per_seq_w * n**exponent``.
    per_seq_w: float = 150.0
    exponent: float = 0.6
    max_batch: int = 64

    def __post_init__(self) -> None:
        if min(self.step_s, self.step_s_per_seq, self.prefill_s_per_token, self.per_seq_w) < 0:
            raise ValueError("a speed's times and watts must be >= 0")
        if self.step_s <= 0:
            raise ValueError("step_s must be > 0 (an engine that takes no time never yields)")
        if self.max_batch < 1:
            raise ValueError("max_batch must be >= 1")

    def step_seconds(self, batch: int, prefill_tokens: int) -> float:
        return (self.step_s + self.step_s_per_seq * max(batch - 1, 0)
                + self.prefill_s_per_token * prefill_tokens)


@dataclass(eq=False)
class Sequence:
    """One request in the engine: its prompt, how many tokens it may write, what it wrote."""

    prompt_tokens: int
    max_tokens: int
    generated: int = 0
    finish_reason: str | None = None
    job: Job | None = None
    out: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)
    cancelled: bool = False
    #: The finish reason when it reaches ``max_tokens``: ``length``, or ``stop`` where the
    #: model would have ended there anyway.
    ends_with: str = "length"


class Engine:
    """Steps one batch on one card. ``submit`` a sequence, then iterate ``tokens`` on it."""

    def __init__(self, card: SimulatedCard, speed: Speed | None = None) -> None:
        self.card = card
        self.speed = speed or Speed()
        self._waiting: deque[Sequence] = deque()
        self._active: list[Sequence] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: What the engine has done, for tests and the upstream's /metrics.
        self.steps = 0
        self.last_step_s: float | None = None
        self.last_batch = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0

    @property
    def running(self) -> int:
        return len(self._active)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="demo-engine")

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for seq in [*self._active, *self._waiting]:
            self._finish(seq, "abort")
        self._active.clear()
        self._waiting.clear()

    def submit(self, prompt_tokens: int, max_tokens: int, ends_with: str = "length") -> Sequence:
        """Queue a sequence; ``max_tokens=0`` is a prefill-only one (an embedding)."""
        if self._task is None:
            raise RuntimeError("the engine is not started (call start() inside the event loop)")
        seq = Sequence(prompt_tokens=max(prompt_tokens, 1), max_tokens=max(max_tokens, 0),
                       ends_with=ends_with)
        self._waiting.append(seq)
        self._wake.set()
        return seq

    def cancel(self, seq: Sequence) -> None:
        """The client left: the sequence leaves the batch at the next step."""
        seq.cancelled = True

    async def tokens(self, seq: Sequence) -> AsyncIterator[int]:
        """Each token's index as its step ends; returns when the sequence finishes."""
        try:
            while (token := await seq.out.get()) is not None:
                yield token
        finally:
            if seq.finish_reason is None:
                self.cancel(seq)

    async def wait(self, seq: Sequence) -> int:
        """Run the sequence to its end; the number of tokens it wrote."""
        async for _ in self.tokens(seq):
            pass
        return seq.generated

    async def _run(self) -> None:
        while True:
            if not self._active and not self._waiting:
                self._wake.clear()
                await self._wake.wait()
            admitted: list[Sequence] = []
            while self._waiting and len(self._active) < self.speed.max_batch:
                seq = self._waiting.popleft()
                if seq.cancelled:
                    self._finish(seq, "abort")
                    continue
                seq.job = self.card.start_job(0.0)
                admitted.append(seq)
                self._active.append(seq)
            self._retune()
            prefill = sum(s.prompt_tokens for s in admitted)
            self.prompt_tokens_total += prefill
            step = self.speed.step_seconds(len(self._active), prefill)
            self.last_step_s, self.last_batch = step, len(self._active)
            await asyncio.sleep(step)
            self.steps += 1
            for seq in list(self._active):
                if seq.cancelled:
                    self._leave(seq, "abort")
                    continue
                if seq.generated < seq.max_tokens:
                    seq.generated += 1
                    self.generation_tokens_total += 1
                    seq.out.put_nowait(seq.generated)
                if seq.generated >= seq.max_tokens:
                    self._leave(seq, seq.ends_with)
            self._retune()

    def _leave(self, seq: Sequence, reason: str) -> None:
        self._active.remove(seq)
        self._finish(seq, reason)

    def _finish(self, seq: Sequence, reason: str) -> None:
        if seq.job is not None:
            self.card.stop_job(seq.job)
        if seq.finish_reason is None:
            seq.finish_reason = reason
        seq.out.put_nowait(None)

    def _retune(self) -> None:
        n = len(self._active)
        if n == 0:
            return
        each = batch_watts(n, per_seq_w=self.speed.per_seq_w, exponent=self.speed.exponent) / n
        for seq in self._active:
            if seq.job is not None and seq.job.load_w != each:
                self.card.set_load(seq.job, each)
