"""A simulated card that one's own app loads: ``Node(reader="simulated")`` with no URL.

A new user without a GPU wants sensible figures from their own requests, not from the demo's
upstream. This card lives in the process: it draws an idle floor plus a power for each window
open on its node (the windows of the node's own requests), with ramps up and down, a little
jitter, and a cumulative counter that steps in whole millijoules about every 100 ms, as an
A100/H100 register does. Every figure it gives is labelled ``simulated`` (method and backend):
it never reads as measured.

The card does not know the ledger. What loads it is a *load source*: a callable giving the
node's cumulative window-seconds and the windows open now (the ledger's ``card_load``: every
process's windows at the card's table where this process holds it, so that the workers of
one server load one simulated card, as they would a GPU), handed
to :meth:`LocalSimulatedReader.drive` by the reader thread once the reader is built. Between
two reads the card is loaded by the mean number of windows over that interval (the change
of window-seconds over the time), so its energy follows the windows' own time exactly
whatever the pace of the reads; without a load source it idles.

The physics is :class:`~.simulated.SimulatedCard`, run on a clock this reader advances to
each read. The idle floor is the node's ``idle_w`` when given, else the simulation's own
(``DEFAULT_IDLE_W``), which the reader exposes as ``simulated_idle_w`` so that the ledger
charges above it and says which floor it used.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Literal

from ..errors import ConfigError
from .base import Kind, ReaderSpec, Reading
from .options import Options
from .simulated import SimulatedCard, VirtualClock

#: The simulation's own idle floor (W) when the node gives none.
DEFAULT_IDLE_W = 60.0
#: Above-idle power of one open window (W): one LLM request's share of an H100-class card.
DEFAULT_WINDOW_W = 200.0
DEFAULT_CAP_W = 700.0
DEFAULT_PERIOD_S = 0.1
OPTIONS = ("window_w", "cap_w", "seed", "jitter", "ramp_up_s", "ramp_down_s")

#: (cumulative window-seconds, windows open now) on the node, at the reader's clock.
LoadSource = Callable[[], tuple[float, int]]


def window_watts(mean_windows: float, window_w: float) -> float:
    """Above-idle draw of ``mean_windows`` windows in flight: linear up to one window (a
    window open for part of an interval), sublinear beyond (batched requests share weight
    reads, as a GPU's do)."""
    if mean_windows <= 0:
        return 0.0
    if mean_windows <= 1:
        return window_w * mean_windows
    return window_w * mean_windows**0.6


class LocalSimulatedReader:
    """Reads an in-process :class:`SimulatedCard` loaded by the node's own windows.

    Options: ``window_w`` (W per open window, 200), ``cap_w`` (700), ``seed``, ``jitter``
    (the power's relative noise, 0.03), ``ramp_up_s`` (0.03), ``ramp_down_s`` (0.06). The
    counter period is the node's ``period_s`` (0.1 s).
    """

    backend = "simulated"
    source = "local"
    method: Literal["measured", "simulated"] = "simulated"
    kind: Kind = "counter"
    remedy = "the simulated card cannot fail by itself: report this as a bug"

    def __init__(self, spec: ReaderSpec) -> None:
        opts = Options(spec.options, "simulated", OPTIONS)
        self.simulated_idle_w = spec.idle_w if spec.idle_w is not None else DEFAULT_IDLE_W
        self.window_w = opts.number("window_w", DEFAULT_WINDOW_W)
        cap = opts.number("cap_w", DEFAULT_CAP_W)
        if cap <= self.simulated_idle_w:
            raise ConfigError(f"reader 'simulated': cap_w {cap:g} W must exceed the idle floor "
                              f"{self.simulated_idle_w:g} W")
        seed = opts.raw.get("seed")
        self._noise = opts.number("jitter", 0.03, strict=False)
        self._rng = random.Random(seed if isinstance(seed, int) and not isinstance(seed, bool) else None)
        self.clock: Callable[[], float] = spec.clock
        self.period = spec.period or DEFAULT_PERIOD_S
        self._card_clock = VirtualClock(self.clock())
        self.card = SimulatedCard(
            idle_w=self.simulated_idle_w, cap_w=cap, counter_period=self.period,
            clock=self._card_clock, jitter=0.2, resolution_j=0.001,
            ramp_up_s=opts.number("ramp_up_s", 0.03, strict=False),
            ramp_down_s=opts.number("ramp_down_s", 0.06, strict=False),
            start_j=self._rng.uniform(1e5, 1e6), seed=self._rng.randrange(2**32),
        )
        self._job = self.card.start_job(0.0)
        self._offset = 0.0  # what the counter reads beyond this copy's own (a last holder's)
        self._load: LoadSource | None = None
        self._seen: tuple[float, float] | None = None  # (t, window-seconds) at the last read
        own = "the node's" if spec.idle_w is not None else "the simulation's own: set idle_w to use yours"
        self.notes = [
            f"simulated card in this process: idle {self.simulated_idle_w:g} W ({own}); "
            f"{self.window_w:g} W for one open window, n windows {self.window_w:g} x n^0.6 W (batched), "
            f"the card {cap:g} W at most; counter steps every {self.period * 1000:g} ms"
        ]

    def drive(self, load: LoadSource) -> None:
        """Load the card from now on with the windows ``load`` reports."""
        self._load = load
        self._seen = None

    def resume(self, t: float, joules: float) -> None:
        """Go on from the counter the card's last holder read (``joules`` at ``t``): this copy
        reads that from ``t`` on, at its idle floor until its own load is known again."""
        self._card_clock.now = max(self._card_clock.now, t)
        self._offset = joules - self.card.energy_j()
        self._seen = None

    def read(self) -> Reading:
        t = self.clock()
        if self._load is not None:
            window_s, _open = self._load()
            if self._seen is not None and t > self._seen[0]:
                mean = max(0.0, (window_s - self._seen[1]) / (t - self._seen[0]))
                above = window_watts(mean, self.window_w)
                if above > 0 and self._noise > 0:
                    above = max(0.0, above * self._rng.gauss(1.0, self._noise))
                self.card.set_load(self._job, above)  # over the interval that ends now
            self._seen = (t, window_s)
        self._card_clock.now = max(self._card_clock.now, t)
        return Reading(t=t, joules=self.card.energy_j() + self._offset)

    def close(self) -> None:
        return None


__all__ = ["DEFAULT_IDLE_W", "DEFAULT_WINDOW_W", "LoadSource", "LocalSimulatedReader", "window_watts"]
