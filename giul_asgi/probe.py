"""`giul-asgi probe`: what every reader this host can reach answers, measured, never assumed.

For local NVML: what each GPU answers (energy counter, instant and averaged power, MIG,
compute processes), the counter's *observed* update period (read fast for a couple of
seconds and time its steps), the counter against integrated instant power over the same
span, and, when asked (``idle_seconds``), the measured idle floor to paste into config.
For an agent URL, a dcgm-exporter URL, the local DCGM host engine through ``dcgmi dmon``
and an upstream metrics URL: whether they answer, what they say, and what a reader built on
them reads (through an agent, each GPU's counter period on its own). ``--idle`` measures the
floor through every reader reached, or says why not. A host without a GPU says so.

``probe_report`` returns a JSON-able dict (``--json``); ``format_probe`` prints it for
people with sensible rounding. Nothing here invents a figure: what was not measured is
absent or None.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import socket
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any

from .errors import GiulError
from .readers.base import ReaderSpec

SCHEMA = "giul-probe/1"
FAST_READ_S = 0.002

Sample = tuple[float, float | None, float | None]  # (t, counter J, instant W)


def _version() -> str | None:
    try:
        from . import __version__

        return str(__version__)
    except Exception:  # the package's own version first; the installed metadata may be older
        pass
    try:
        from importlib.metadata import version

        return version("giul-asgi")
    except Exception:
        return None


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def sample(
    read: Callable[[], tuple[float | None, float | None]],
    seconds: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    interval: float = FAST_READ_S,
) -> list[Sample]:
    """Read ``(counter J, instant W)`` as fast as ``interval`` allows for ``seconds``."""
    out: list[Sample] = []
    end = clock() + seconds
    while True:
        counter, watts = read()
        now = clock()
        out.append((now, counter, watts))
        if now >= end:
            return out
        sleep(interval)


def analyse(samples: list[Sample]) -> dict[str, Any]:
    """Update period of the counter, and the counter against integrated power over one span."""
    steps = [(t, c) for (t, c, _w), (_pt, pc, _pw) in zip(samples[1:], samples, strict=False)
             if c is not None and pc is not None and c != pc]
    gaps = [b[0] - a[0] for a, b in pairwise(steps)]
    out: dict[str, Any] = {
        "reads": len(samples),
        "seconds": samples[-1][0] - samples[0][0] if samples else 0.0,
        "counter_steps": len(steps),
        "update_period_s": statistics.median(gaps) if gaps else None,
        "update_period_p90_s": _percentile(gaps, 0.9),
        "counter_resolution_j": min((abs(b[1] - a[1]) for a, b in pairwise(steps)), default=None),
    }
    if len(steps) >= 2:
        (t0, c0), (t1, c1) = steps[0], steps[-1]
        span = [(t, w) for t, _c, w in samples if t0 <= t <= t1 and w is not None]
        integrated = sum((b[0] - a[0]) * (a[1] + b[1]) / 2 for a, b in pairwise(span))
        out["counter_j"] = c1 - c0
        out["counter_mean_w"] = (c1 - c0) / (t1 - t0) if t1 > t0 else None
        if len(span) >= 2 and t1 > t0:
            out["integrated_power_j"] = integrated
            out["counter_over_power"] = (c1 - c0) / integrated if integrated > 0 else None
    return out


def _nvml_section(nvml: Any | None, gpus: Sequence[int], seconds: float, idle_seconds: float | None,
                  clock: Callable[[], float], sleep: Callable[[float], None]) -> dict[str, Any]:
    from .readers.nvml import NvmlReader

    try:
        reader = NvmlReader(ReaderSpec(gpus=tuple(gpus), clock=clock), nvml=nvml)
    except GiulError as exc:
        return {"available": False, "reason": exc.message, "remedy": exc.remedy or None}
    try:
        processes = reader.processes()
        out: dict[str, Any] = {
            "available": True, "backend": reader.backend, "kind": reader.kind,
            "notes": list(reader.notes),
            "processes": None if processes is None
            else [{"pid": p.pid, "name": p.name} for p in processes],
            "gpus": [],
        }
        for position, probe in enumerate(reader.probes):
            gpu: dict[str, Any] = {
                "index": probe.index, "name": probe.name, "uuid": probe.uuid,
                "counter": probe.counter, "instant_power": probe.instant_power,
                "average_power": probe.average_power, "mig": probe.mig,
                "processes_listed": probe.processes,
            }

            def read_one(position: int = position) -> tuple[float | None, float | None]:
                reading = reader.read_gpu(position)
                return reading.energy_j, reading.power_w

            if probe.average_power:
                gpu["average_power_w"] = reader.read_gpu(position, average=True).average_w
            if probe.counter or probe.instant_power:
                gpu["sampling"] = analyse(sample(read_one, seconds, clock=clock, sleep=sleep))
            out["gpus"].append(gpu)
        if idle_seconds:
            out["idle"] = _idle(reader, idle_seconds, clock, sleep)
        return out
    finally:
        reader.close()


def _idle(
    reader: Any, seconds: float, clock: Callable[[], float], sleep: Callable[[float], None]
) -> dict[str, Any]:
    """Mean power over ``seconds`` of (what should be) an idle node, from the counter or the gauge."""
    samples: list[tuple[float, float | None, float | None]] = []
    end = clock() + seconds
    while True:
        reading = reader.read()
        samples.append((reading.t, reading.joules, reading.watts))
        if clock() >= end:
            break
        sleep(min(0.05, seconds / 20))
    ok = [s for s in samples if s[1] is not None or s[2] is not None]
    if len(ok) < 2:
        return {"seconds": seconds, "idle_w": None, "reason": "too few good readings"}
    if reader.kind == "counter":
        changes = [s for s, p in zip(ok[1:], ok, strict=False) if s[1] != p[1]]
        first = next((s for s in ok if s[1] != ok[0][1]), ok[0])
        last = changes[-1] if changes else ok[-1]
        if last[0] <= first[0] or first[1] is None or last[1] is None:
            return {"seconds": seconds, "idle_w": None, "reason": "the counter did not move"}
        idle = (last[1] - first[1]) / (last[0] - first[0])
    else:
        watts = [s[2] for s in ok if s[2] is not None]
        idle = statistics.fmean(watts)
    return {"seconds": seconds, "idle_w": idle, "readings": len(ok),
            "note": "measured now: make sure nothing else ran on the card meanwhile"}


def _agent_section(url: str, token: str | None, gpus: Sequence[int], seconds: float,
                   idle_seconds: float | None, clock: Callable[[], float],
                   sleep: Callable[[float], None]) -> dict[str, Any]:
    from .readers.agent import AgentReader

    try:
        reader = AgentReader(ReaderSpec(gpus=tuple(gpus), url=url, token=token, clock=clock))
    except GiulError as exc:
        return {"url": url, "reachable": False, "reason": exc.message, "remedy": exc.remedy or None}
    try:
        first = reader.read()
        out: dict[str, Any] = {
            "url": reader.url, "reachable": first.ok or reader.host is not None, "host": reader.host,
            "method": reader.method, "kind": reader.kind, "notes": list(reader.notes),
            "first_reading": {"joules": first.joules, "watts": first.watts, "error": first.error},
            "clock_offset_s": reader.alignment.offset, "round_trip_s": reader.alignment.rtt,
        }
        if first.ok:
            out["gpus"] = _agent_gpus(reader, seconds, clock, sleep)
            out["round_trip_s"] = reader.alignment.rtt
        if idle_seconds:
            out["idle"] = _idle(reader, idle_seconds, clock, sleep) if first.ok else _not_measured(
                f"the agent gave no reading ({first.error})")
        return out
    finally:
        reader.close()


def _agent_gpus(reader: Any, seconds: float, clock: Callable[[], float],
                sleep: Callable[[float], None]) -> list[dict[str, Any]]:
    """Each of the agent's GPUs sampled on its own: the counter period is a card's, and two
    cards summed step at both phases (two 100 ms cards looked like one of 56 ms)."""
    per_gpu: dict[int, list[Sample]] = {}
    end = clock() + seconds
    while True:
        readings = reader.gpu_readings()
        if not isinstance(readings, str):
            for index, r in readings.items():
                if r.error is None:
                    per_gpu.setdefault(index, []).append((r.t, r.joules, r.watts))
        if clock() >= end:
            break
        sleep(0.01)
    out = []
    for index, samples in sorted(per_gpu.items()):
        # The agent reads each card once per request: the same read twice is one sample.
        unique = [s for k, s in enumerate(samples) if k == 0 or s[0] != samples[k - 1][0]]
        sampling = analyse(unique)
        sampling["note"] = "through the agent: never faster than its cache period"
        out.append({"index": index, "sampling": sampling})
    return out


def _not_measured(reason: str) -> dict[str, Any]:
    return {"idle_w": None, "reason": reason}


def _dcgm_section(url: str, gpus: Sequence[int], idle_seconds: float | None,
                  clock: Callable[[], float], sleep: Callable[[float], None]) -> dict[str, Any]:
    from .readers.dcgm import DcgmReader

    try:
        reader = DcgmReader(ReaderSpec(gpus=tuple(gpus), url=url, clock=clock))
    except GiulError as exc:
        return {"url": url, "reachable": False, "reason": exc.message}
    try:
        reading = reader.read()
        out: dict[str, Any] = {
            "url": reader.url, "reachable": reading.error is None or "unit" in (reading.error or ""),
            "kind": reader.kind, "period_s": reader.period, "mig": reader.mig,
            "reading": {"joules": reading.joules, "watts": reading.watts, "error": reading.error},
            "notes": list(reader.notes)}
        if idle_seconds:
            if not out["reachable"]:
                out["idle"] = _not_measured(f"the exporter gave no reading ({reading.error})")
            elif idle_seconds < 2 * reader.period:
                out["idle"] = _not_measured(
                    f"dcgm-exporter collects every {reader.period:g} s: give --idle "
                    f"{2 * reader.period:g} or more to see its counter move twice")
            else:
                out["idle"] = _idle(reader, idle_seconds, clock, sleep)
        return out
    finally:
        reader.close()


def _dcgmi_section(gpus: Sequence[int], seconds: float, idle_seconds: float | None,
                   clock: Callable[[], float], sleep: Callable[[float], None]) -> dict[str, Any]:
    """What ``dcgmi dmon`` streams here: its first sample, the counter's period as the stream
    shows it (never finer than dmon's interval), and the idle floor when asked."""
    from .readers.dcgmi import DcgmiReader

    try:
        reader = DcgmiReader(ReaderSpec(gpus=tuple(gpus), clock=clock))
    except GiulError as exc:
        return {"reachable": False, "reason": exc.message, "remedy": exc.remedy or None,
                "error": type(exc).__name__}
    try:
        first = reader.read()
        out: dict[str, Any] = {
            "reachable": True, "command": " ".join(reader.command), "kind": reader.kind,
            "interval_ms": reader.interval_ms, "notes": list(reader.notes),
            "reading": {"joules": first.joules, "watts": first.watts, "error": first.error},
        }

        def read_one() -> tuple[float | None, float | None]:
            r = reader.read()
            return r.joules, r.watts

        out["sampling"] = analyse(sample(read_one, seconds, clock=clock, sleep=sleep,
                                         interval=reader.period / 4))
        out["sampling"]["note"] = f"through dcgmi dmon: never finer than its {reader.interval_ms} ms interval"
        if idle_seconds:
            out["idle"] = _idle(reader, idle_seconds, clock, sleep)
        return out
    finally:
        reader.close()


def _upstream_section(url: str, model: str | None = None) -> dict[str, Any]:
    from .readers.upstream import UpstreamLoad

    try:
        load = UpstreamLoad(url, model=model)
    except GiulError as exc:  # not read at all (prometheus-client missing): what to do about it
        return {"url": url, "reachable": False, "reason": str(exc)}
    try:
        r = load.read()
        return {"url": load.url, "model": model, "reachable": r.error is None, "server": r.server,
                "running": r.running, "waiting": r.waiting,
                "generation_tokens_total": r.generation_tokens_total,
                "prompt_tokens_total": r.prompt_tokens_total, "error": r.error, "notes": list(load.notes)}
    finally:
        load.close()


def probe_report(
    *,
    local: bool = True,
    nvml: Any | None = None,
    gpus: Sequence[int] = (),
    agent_url: str | None = None,
    agent_token: str | None = None,
    dcgm_url: str | None = None,
    dcgmi: bool = False,
    upstream_url: str | None = None,
    upstream_model: str | None = None,
    idle_seconds: float | None = None,
    sample_seconds: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Everything the reachable readers answer, as a JSON-able dict."""
    report: dict[str, Any] = {
        "schema": SCHEMA, "giul_asgi": _version(), "host": socket.gethostname(),
        "platform": platform.platform(), "python": platform.python_version(),
        "sample_seconds": sample_seconds,
    }
    if local:
        report["nvml"] = _nvml_section(nvml, gpus, sample_seconds, idle_seconds, clock, sleep)
        if idle_seconds and not report["nvml"]["available"]:
            report["nvml"]["idle"] = _not_measured(f"no local NVML ({report['nvml']['reason']})")
    if agent_url:
        report["agent"] = _agent_section(agent_url, agent_token, gpus, sample_seconds, idle_seconds,
                                         clock, sleep)
    if dcgm_url:
        report["dcgm"] = _dcgm_section(dcgm_url, gpus, idle_seconds, clock, sleep)
    if dcgmi:
        report["dcgmi"] = _dcgmi_section(gpus, sample_seconds, idle_seconds, clock, sleep)
        if idle_seconds and not report["dcgmi"]["reachable"]:
            report["dcgmi"]["idle"] = _not_measured(f"dcgmi gave no sample ({report['dcgmi']['reason']})")
    if upstream_url:
        report["upstream"] = _upstream_section(upstream_url, upstream_model)
    if idle_seconds and not (local or agent_url or dcgm_url or dcgmi):
        report["idle"] = _not_measured("no reader to measure it through: drop --no-local, or give "
                                       "--agent URL, --dcgm URL or --dcgmi")
    for reader, url in (("nvml", None), ("agent", agent_url), ("dcgm", dcgm_url), ("dcgmi", None)):
        idle = (report.get(reader) or {}).get("idle") or {}
        if idle.get("idle_w") is not None:
            indices = [g.get("index") for g in (report.get(reader) or {}).get("gpus") or []]
            report["suggested_config"] = {"reader": reader, "idle_w": round(idle["idle_w"], 1),
                                          "gpus": indices, **({"url": url} if url else {})}
            break
    return report


def _fmt(value: Any, unit: str = "", digits: int = 1, scale: float = 1.0) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value * scale:.{digits}f}{unit}"
    return f"{value}{unit}"


def _format_sampling(s: dict[str, Any], lines: list[str]) -> None:
    lines.append(f"    sampled {s['reads']} reads over {_fmt(s['seconds'], ' s', 2)}: "
                 f"{s['counter_steps']} counter steps")
    lines.append(f"    counter update period: median {_fmt(s.get('update_period_s'), ' ms', 1, 1000)}, "
                 f"p90 {_fmt(s.get('update_period_p90_s'), ' ms', 1, 1000)}")
    if s.get("counter_j") is not None:
        lines.append(f"    counter {_fmt(s['counter_j'], ' J', 3)} ({_fmt(s.get('counter_mean_w'), ' W')}) "
                     f"vs integrated instant power {_fmt(s.get('integrated_power_j'), ' J', 3)}: "
                     f"ratio {_fmt(s.get('counter_over_power'), '', 3)}")
    if s.get("note"):
        lines.append(f"    ({s['note']})")


def _format_idle(idle: dict[str, Any] | None, lines: list[str], indent: str = "  ") -> None:
    if not idle:
        return
    if idle.get("idle_w") is None:
        lines.append(f"{indent}idle floor: not measured: {idle.get('reason') or 'no reading'}")
        return
    lines.append(f"{indent}idle floor over {_fmt(float(idle['seconds']), ' s')}: {_fmt(idle['idle_w'], ' W')}"
                 f" from {idle.get('readings')} readings")


def format_probe(report: dict[str, Any]) -> str:
    """The report for people."""
    lines = [f"giul-asgi {report.get('giul_asgi') or '?'} probe on {report['host']} "
             f"({report['platform']}), python {report['python']}"]
    nvml = report.get("nvml")
    if nvml is not None:
        if not nvml["available"]:
            lines.append(f"local NVML: not available: {nvml['reason']}")
            if nvml.get("remedy"):
                lines.append(f"  remedy: {nvml['remedy']}")
            lines.append("  -> no local GPU reader: figures here are estimated or unknown, never invented")
            _format_idle(nvml.get("idle"), lines)
        else:
            lines.append(f"local NVML: backend {nvml['backend']} ({nvml['kind']})")
            for note in nvml["notes"]:
                lines.append(f"  note: {note}")
            for g in nvml["gpus"]:
                lines.append(f"  gpu {g['index']}: {g['name'] or '?'} {g['uuid'] or ''}".rstrip())
                lines.append(f"    energy counter {_fmt(g['counter'])}, "
                             f"instant power {_fmt(g['instant_power'])}, "
                             f"averaged power {_fmt(g['average_power'])} "
                             f"(now {_fmt(g.get('average_power_w'), ' W')}), MIG {_fmt(g['mig'])}")
                if g.get("sampling"):
                    _format_sampling(g["sampling"], lines)
            procs = nvml["processes"]
            lines.append("  compute processes: " + ("cannot be listed" if procs is None else (
                ", ".join(f"{p['pid']} ({p['name'] or '?'})" for p in procs) or "none")))
            _format_idle(nvml.get("idle"), lines)
    dmon = report.get("dcgmi")
    if dmon is not None:
        if not dmon["reachable"]:
            lines.append(f"dcgmi dmon: not available: {dmon['reason']}")
            if dmon.get("remedy"):
                lines.append(f"  remedy: {dmon['remedy']}")
        else:
            r = dmon["reading"]
            lines.append(f"dcgmi dmon: `{dmon['command']}`, {dmon['kind']}, "
                         f"joules {_fmt(r['joules'], '', 3)}, watts {_fmt(r['watts'])}"
                         + (f", error: {r['error']}" if r["error"] else ""))
            _format_sampling(dmon["sampling"], lines)
            for note in dmon["notes"]:
                lines.append(f"  note: {note}")
        _format_idle(dmon.get("idle"), lines)
    for key, title in (("agent", "agent"), ("dcgm", "dcgm-exporter"), ("upstream", "upstream")):
        section = report.get(key)
        if section is None:
            continue
        if not section.get("reachable"):
            readings = (section.get("first_reading"), section.get("reading"))
            why = section.get("reason") or section.get("error") or next(
                (r["error"] for r in readings if r and r.get("error")), "no reason given")
            lines.append(f"{title} {section['url']}: not read: {why}")
            _format_idle(section.get("idle"), lines)
            continue
        if key == "agent":
            lines.append(f"agent {section['url']}: host {section['host']}, "
                         f"{section['method']}, {section['kind']}; "
                         f"round trip {_fmt(section['round_trip_s'], ' ms', 1, 1000)}, "
                         f"clock offset {_fmt(section['clock_offset_s'], ' s', 3)}")
            for g in section.get("gpus") or []:
                lines.append(f"  gpu {g['index']}:")
                _format_sampling(g["sampling"], lines)
        elif key == "dcgm":
            r = section["reading"]
            lines.append(f"dcgm-exporter {section['url']}: {section['kind']}, "
                         f"period {_fmt(section['period_s'], ' s')}, "
                         f"joules {_fmt(r['joules'], '', 3)}, watts {_fmt(r['watts'])}"
                         + (f", error: {r['error']}" if r["error"] else ""))
        else:
            model = f" (model {section['model']})" if section.get("model") else ""
            lines.append(f"upstream {section['url']}{model}: {section['server']}: "
                         f"running {_fmt(section['running'])}, waiting {_fmt(section.get('waiting'))}, "
                         f"generation tokens {_fmt(section['generation_tokens_total'], '', 0)}, "
                         f"prompt tokens {_fmt(section['prompt_tokens_total'], '', 0)}")
        for note in section.get("notes") or []:
            lines.append(f"  note: {note}")
        _format_idle(section.get("idle"), lines)
    _format_idle(report.get("idle"), lines, indent="")
    if report.get("suggested_config"):
        cfg = report["suggested_config"]
        gpus = cfg.get("gpus") or []
        # Several GPUs measured together make one node's floor (a stranger pasted two cards'
        # sum into a node of one): say which.
        which = (f", GPUs {', '.join(map(str, gpus))} together: the floor of a node of these GPUs "
                 "(--gpus measures others)") if len(gpus) > 1 else (f", GPU {gpus[0]}" if gpus else "")
        lines.append(f"paste into the node's config: idle_w = {cfg['idle_w']} "
                     f"(measured through {cfg['reader']}{which})")
    return "\n".join(lines)


def answered(report: dict[str, Any]) -> bool:
    """Whether anything the probe asked answered: local NVML, or a reader it was pointed at."""
    if (report.get("nvml") or {}).get("available"):
        return True
    return any((report.get(key) or {}).get("reachable") for key in ("agent", "dcgm", "dcgmi", "upstream"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``giul-asgi probe`` options."""
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--idle", type=float, metavar="SECONDS", default=None,
                        help="measure the idle floor over SECONDS (keep the card idle meanwhile)")
    parser.add_argument("--sample", type=float, metavar="SECONDS", default=2.0,
                        help="how long to read fast to time the counter's steps (default 2)")
    parser.add_argument("--gpus", default="", help="NVML (or agent/dcgm) GPU indices, e.g. 0,1")
    parser.add_argument("--agent", metavar="URL", default=None, help="a giul-agent to probe")
    parser.add_argument("--agent-token-file", metavar="FILE", default=None, help="that agent's bearer token")
    parser.add_argument("--dcgm", metavar="URL", default=None, help="a dcgm-exporter /metrics URL to probe")
    parser.add_argument("--dcgmi", action="store_true",
                        help="probe the local DCGM host engine through `dcgmi dmon` (reader='dcgmi')")
    parser.add_argument("--upstream", metavar="URL", default=None,
                        help="a vLLM/TGI/SGLang/TensorRT-LLM /metrics URL to probe")
    parser.add_argument("--upstream-model", metavar="NAME", default=None,
                        help="count only this model's requests at --upstream (a node's upstream_model)")
    parser.add_argument("--no-local", action="store_true", help="skip local NVML")


def run(args: argparse.Namespace) -> int:
    try:
        gpus = tuple(int(g) for g in args.gpus.split(",") if g.strip())
    except ValueError:
        print(f"giul-asgi probe: --gpus must be indices like 0,1, got {args.gpus!r}", file=sys.stderr)
        return 2
    token = None
    if args.agent_token_file:
        with open(args.agent_token_file, encoding="utf-8") as fh:
            token = fh.read().strip() or None
    report = probe_report(local=not args.no_local, gpus=gpus, agent_url=args.agent, agent_token=token,
                          dcgm_url=args.dcgm, dcgmi=args.dcgmi, upstream_url=args.upstream,
                          upstream_model=args.upstream_model,
                          idle_seconds=args.idle,
                          sample_seconds=args.sample)
    print(json.dumps(report, indent=2) if args.json else format_probe(report))
    if not answered(report):  # a one-shot check that found nothing to read failed
        print("giul-asgi probe: nothing answered (no local NVML, and no reader it was pointed at "
              "was reachable)", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="giul-asgi probe", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
