"""The prepared GPU check: what a real NVIDIA card does, measured on it, in under five minutes.

Run it on any machine with an NVIDIA card and commit its output under benchmarks/results/:

    python benchmarks/gpu_check.py --gpu 0 --out benchmarks/results/gpu_check-$(date +%F)-<card>.md

It records, for one GPU:

1. the energy counter's update period (read every ~1 ms; median and p90 of the time
   between steps), idle and under load;
2. instant (``NVML_FI_DEV_POWER_INSTANT``) against averaged (``nvmlDeviceGetPowerUsage``)
   power across a load step: each one's level before and during the load, how long each
   takes to show half the step, and the counter's own mean power over the same spans;
3. NVML call latency, p50/p99/max over 2000 calls each (counter, instant field, averaged
   gauge, compute-process list);
4. ledger figures for a known load: windows opened while the load runs, their charged
   joules against the counter's above-idle energy over the same spans, and the ledger's
   conservation error.

The load is a matrix-multiply loop on the GPU through torch or cupy (whichever imports);
without either, sections 2 and 4 say they were skipped. ``--fake`` runs the same code against
``tests/fake_nvml.LiveGpu`` (a counter stepping every 100 ms, a load that adds watts), so the
script is exercised by the test suite on machines with no GPU; its numbers describe the fake.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from giul_asgi.probe import analyse, sample  # noqa: E402
from giul_asgi.readers.base import ReaderSpec  # noqa: E402
from giul_asgi.readers.nvml import NvmlReader, instant_power_mw, load_nvml  # noqa: E402


class Load:
    """A GPU load that can be switched on and off (a real matmul loop, or the fake's watts)."""

    def __init__(self, fake_gpu: Any | None, gpu: int) -> None:
        self.fake_gpu = fake_gpu
        self.gpu = gpu
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.reason: str | None = None
        self._step: Callable[[], None] | None = None
        self.added_w = 250.0  # what the fake's load adds; a real load's is measured, not known
        if fake_gpu is not None:
            self.idle_w = fake_gpu.watts
            return
        try:
            import torch

            device = torch.device(f"cuda:{gpu}")
            a = torch.randn(8192, 8192, device=device, dtype=torch.float16)

            def torch_step() -> None:
                (a @ a).sum().item()

            self._step = torch_step
        except Exception as exc:
            try:
                import cupy

                with cupy.cuda.Device(gpu):
                    b = cupy.random.rand(4096, 4096, dtype=cupy.float32)

                def cupy_step() -> None:
                    with cupy.cuda.Device(gpu):
                        float((b @ b).sum())

                self._step = cupy_step
            except Exception as exc2:
                self.reason = f"no load generator (torch: {exc}; cupy: {exc2})"

    @property
    def available(self) -> bool:
        return self.fake_gpu is not None or self._step is not None

    def on(self) -> None:
        if self.fake_gpu is not None:
            self.fake_gpu.watts = self.idle_w + self.added_w
            return
        self._stop.clear()

        def loop() -> None:
            while not self._stop.is_set():
                assert self._step is not None
                self._step()

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def off(self) -> None:
        if self.fake_gpu is not None:
            self.fake_gpu.watts = self.idle_w
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency(calls: dict[str, Callable[[], Any]], n: int) -> dict[str, dict[str, float | str]]:
    out: dict[str, dict[str, float | str]] = {}
    for name, call in calls.items():
        times: list[float] = []
        try:
            for _ in range(n):
                t0 = time.perf_counter()
                call()
                times.append(time.perf_counter() - t0)
        except Exception as exc:
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        out[name] = {"p50_us": pct(times, 0.5) * 1e6, "p99_us": pct(times, 0.99) * 1e6,
                     "max_us": max(times) * 1e6, "calls": float(n)}
    return out


def power_step(nvml: Any, handle: Any, load: Load, before_s: float, during_s: float) -> dict[str, Any]:
    """Instant and averaged power, and the counter, every 10 ms across a load step."""
    rows: list[tuple[float, float | None, float | None, float | None]] = []

    def grab() -> None:
        t = time.monotonic()
        vals: list[float | None] = []
        for call in (lambda: instant_power_mw(nvml, handle) / 1000.0,
                     lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                     lambda: int(nvml.nvmlDeviceGetTotalEnergyConsumption(handle)) / 1000.0):
            try:
                vals.append(call())
            except Exception:
                vals.append(None)
        rows.append((t, vals[0], vals[1], vals[2]))

    start = time.monotonic()
    while time.monotonic() - start < before_s:
        grab()
        time.sleep(0.01)
    switched = time.monotonic()
    load.on()
    try:
        while time.monotonic() - switched < during_s:
            grab()
            time.sleep(0.01)
    finally:
        load.off()

    def mean(col: int, lo: float, hi: float) -> float | None:
        vals = [r[col] for r in rows if lo <= r[0] < hi and r[col] is not None]
        return statistics.fmean(vals) if vals else None  # type: ignore[arg-type]

    def counter_w(lo: float, hi: float) -> float | None:
        span = [r for r in rows if lo <= r[0] < hi and r[3] is not None]
        if len(span) < 2 or span[-1][0] <= span[0][0]:
            return None
        return (span[-1][3] - span[0][3]) / (span[-1][0] - span[0][0])  # type: ignore[operator]

    settle = switched + during_s / 2
    out: dict[str, Any] = {"switched_after_s": switched - start}
    for col, name in ((1, "instant"), (2, "averaged")):
        lo, hi = mean(col, start, switched), mean(col, settle, switched + during_s)
        out[f"{name}_before_w"], out[f"{name}_during_w"] = lo, hi
        half = None
        if lo is not None and hi is not None and hi > lo:
            crossing = next((r[0] for r in rows if r[0] >= switched and r[col] is not None
                             and r[col] >= lo + (hi - lo) / 2), None)  # type: ignore[operator]
            half = None if crossing is None else crossing - switched
        out[f"{name}_half_step_s"] = half
    out["counter_before_w"] = counter_w(start, switched)
    out["counter_during_w"] = counter_w(settle, switched + during_s)
    return out


def ledger_figures(
    reader: NvmlReader, load: Load, windows: int, window_s: float, pause_s: float = 1.0
) -> dict[str, Any]:
    """Windows over a known load: charged joules against the counter's above-idle energy."""
    try:
        from giul_asgi.config import Node
        from giul_asgi.ledger import Ledger
    except Exception as exc:
        return {"skipped": f"ledger not importable: {type(exc).__name__}: {exc}"}
    # idle floor measured now, from the counter, over one second
    first = reader.read()
    time.sleep(max(pause_s, 0.5))
    second = reader.read()
    if first.joules is None or second.joules is None or second.t <= first.t:
        return {"skipped": "the counter gave no idle floor"}
    idle_w = (second.joules - first.joules) / (second.t - first.t)
    try:
        ledger = Ledger(Node("gpu-check", idle_w=idle_w), reader, poll=False)
        warm_until = time.monotonic() + max(pause_s, 0.5)  # let the tape learn the step period
        while time.monotonic() < warm_until:
            ledger.read_now()
            time.sleep(reader.period / 3)
        results = []
        for _ in range(windows):
            ledger.read_now()
            start = reader.read()
            window = ledger.open()
            on_at = time.monotonic()
            load.on()
            end_t = time.monotonic() + window_s
            while time.monotonic() < end_t:
                time.sleep(reader.period)
                ledger.read_now()
            load.off()
            on_s = time.monotonic() - on_at
            ledger.close(window)
            stop = reader.read()
            for _ in range(5):
                time.sleep(reader.period)
                ledger.read_now()
            share = ledger.share(window)
            truth = None
            if start.joules is not None and stop.joules is not None:
                truth = (stop.joules - start.joules) - idle_w * (stop.t - start.t)
            results.append({"charged_j": share.joules, "uncertainty_j": share.uncertainty,
                            "settled": share.settled, "counter_above_idle_j": truth,
                            "fake_truth_j": load.added_w * on_s if load.fake_gpu is not None else None})
            time.sleep(pause_s)
        totals = ledger.totals()
        return {"idle_w": idle_w, "windows": results,
                "conservation_error_j": totals.conservation_error_j, "measured_j": totals.measured_j,
                "charged_j": totals.charged_j, "unattributed_j": totals.unattributed_j}
    except Exception as exc:
        return {"skipped": f"ledger API: {type(exc).__name__}: {exc}"}


def run(args: argparse.Namespace) -> dict[str, Any]:
    fake_gpu = None
    nvml: Any
    if args.fake:
        sys.path.insert(0, str(ROOT / "tests"))
        from fake_nvml import FakeNvml, LiveGpu

        fake_gpu = LiveGpu(watts=70.0, step_s=0.1, processes=[])
        nvml = FakeNvml([fake_gpu])
    else:
        nvml = load_nvml()
    scale = 0.1 if args.quick else 1.0
    reader = NvmlReader(ReaderSpec(gpus=(args.gpu,)), nvml=nvml)
    report: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"), "host": platform.node(),
        "fake": bool(args.fake), "gpu": {"index": args.gpu, "name": reader.probes[0].name,
                                         "uuid": reader.probes[0].uuid, "backend": reader.backend,
                                         "mig": reader.probes[0].mig},
    }
    try:
        handle = reader._handles[0]
        load = Load(fake_gpu, args.gpu)

        def read_one() -> tuple[float | None, float | None]:
            try:
                c = int(nvml.nvmlDeviceGetTotalEnergyConsumption(handle)) / 1000.0
            except Exception:
                c = None
            try:
                w = instant_power_mw(nvml, handle) / 1000.0
            except Exception:
                w = None
            return c, w

        report["update_period_idle"] = analyse(sample(read_one, 3.0 * scale, interval=0.001))
        if load.available:
            load.on()
            try:
                report["update_period_load"] = analyse(sample(read_one, 3.0 * scale, interval=0.001))
            finally:
                load.off()
            time.sleep(2.0 * scale)
            report["power_step"] = power_step(nvml, handle, load, 2.0 * scale, 4.0 * scale)
        else:
            report["power_step"] = {"skipped": load.reason}
        n = 200 if args.quick else 2000
        report["latency"] = latency({
            "counter": lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle),
            "instant_field": lambda: instant_power_mw(nvml, handle),
            "averaged": lambda: nvml.nvmlDeviceGetPowerUsage(handle),
            "processes": lambda: nvml.nvmlDeviceGetComputeProcesses(handle),
        }, n)
        if load.available and reader.kind == "counter":
            report["ledger"] = ledger_figures(reader, load, 2 if args.quick else 3, 2.0 * max(scale, 0.2),
                                              pause_s=1.0 * scale)
        else:
            report["ledger"] = {"skipped": load.reason or "no energy counter"}
    finally:
        reader.close()
    return report


def _f(value: Any, digits: int = 1, scale: float = 1.0) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}" if isinstance(value, float) else str(value)


def markdown(r: dict[str, Any]) -> str:
    g = r["gpu"]
    lines = [f"# gpu_check {r['date']} on {r['host']}{' (FAKE card: tests/fake_nvml)' if r['fake'] else ''}",
             "", f"GPU {g['index']}: {g['name']} {g['uuid']}, backend {g['backend']}, MIG {g['mig']}", "",
             "| counter | reads | steps | median period ms | p90 ms | resolution J | counter/instant power |",
             "|---|---|---|---|---|---|---|"]
    for key in ("update_period_idle", "update_period_load"):
        s = r.get(key)
        if s:
            lines.append(f"| {key.split('_')[-1]} | {s['reads']} | {s['counter_steps']} | "
                         f"{_f(s['update_period_s'], 1, 1000)} | {_f(s['update_period_p90_s'], 1, 1000)} | "
                         f"{_f(s['counter_resolution_j'], 3)} | {_f(s.get('counter_over_power'), 3)} |")
    p = r["power_step"]
    lines += ["", "Power across a load step:"]
    if "skipped" in p:
        lines.append(f"skipped: {p['skipped']}")
    else:
        lines += ["", "| source | before W | during W | time to half the step s |", "|---|---|---|---|"]
        for name in ("instant", "averaged"):
            lines.append(f"| {name} | {_f(p[f'{name}_before_w'])} | {_f(p[f'{name}_during_w'])} | "
                         f"{_f(p[f'{name}_half_step_s'], 3)} |")
        lines.append(f"| counter | {_f(p['counter_before_w'])} | {_f(p['counter_during_w'])} | - |")
    lines += ["", "| NVML call | p50 us | p99 us | max us |", "|---|---|---|---|"]
    for name, v in r["latency"].items():
        if "error" in v:
            lines.append(f"| {name} | {v['error']} | | |")
        else:
            lines.append(f"| {name} | {_f(v['p50_us'])} | {_f(v['p99_us'])} | {_f(v['max_us'])} |")
    led = r["ledger"]
    lines += ["", "Ledger over a known load:"]
    if "skipped" in led:
        lines.append(f"skipped: {led['skipped']}")
    else:
        lines += [f"idle floor (from the counter) {_f(led['idle_w'])} W; conservation error "
                  f"{_f(led['conservation_error_j'], 6)} J", "",
                  "| window | charged J | uncertainty J | settled | counter above idle J (+-1 step) "
                  "| fake's truth J |", "|---|---|---|---|---|---|"]
        for i, w in enumerate(led["windows"]):
            lines.append(f"| {i} | {_f(w['charged_j'], 2)} | {_f(w['uncertainty_j'], 2)} | {w['settled']} | "
                         f"{_f(w['counter_above_idle_j'], 2)} | {_f(w.get('fake_truth_j'), 2)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU to check")
    parser.add_argument("--fake", action="store_true", help="run against tests/fake_nvml (no GPU needed)")
    parser.add_argument("--quick", action="store_true", help="a tenth of every duration (for tests)")
    parser.add_argument("--out", type=Path, default=None, help="also write the markdown table here")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw report as JSON here")
    args = parser.parse_args(argv)
    report = run(args)
    text = markdown(report)
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
