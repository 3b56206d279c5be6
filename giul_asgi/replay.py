"""A ledger's trace, run again through the same tape and book: ``giul-asgi replay``.

Why: a figure should be re-derivable by someone who was not there. A user attaches the
trace a node wrote (``Node(trace=DIR)``, :mod:`giul_asgi.ledger.trace`) to a bug report,
and anyone can rebuild every figure from the card's own readings; an operator replays real
traffic with another split (``--split tokens``) or another idle floor (``--idle-w``) and
sees what each route and tier would have been charged.

Replay builds a :class:`~giul_asgi.ledger.Ledger` that reads nothing (``poll=False``) on a
virtual clock set to each event's time, and hands it the events in the order the live
ledger's lock took them: the same code, so with the live split the same figures (the test
checks every request to 1e-9). Each figure is graded by :func:`~giul_asgi.energy.grade` and
labelled ``source: replay``.

Bad input is said, never guessed around: a missing file or directory, an empty trace and a
trace without a header are errors with a remedy (exit 2); garbage lines (a line nested too
deeply for the parser included) and a last line cut short are skipped, counted and said
with their file and line; rotated files are read oldest first, and a trace whose oldest
part was rotated away says that its first windows cannot agree with live. A directory
stands for every trace in it (one per node and process: a server with four workers leaves
four), each replayed in turn (:func:`command`, ``giul-asgi replay DIR``).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .config import Node
from .energy import grade
from .errors import ConfigError, GiulError
from .ledger import Ledger, Window
from .ledger.phases import split_for
from .ledger.trace import VERSION, rotated
from .readers.base import Kind, Reading
from .spans import CardSpan, Gap

#: Replay agrees with live when every settled window's joules are this close (relative).
AGREES = 1e-9
_REMEDY = "give a trace file a node wrote (Node(trace=DIR) writes DIR/giul-trace-<node>-<pid>.jsonl)"

# What each event holds after its kind: a checker per item (a time is a finite number).
_NUM = "num"
_OPT_NUM = "num?"
_ID = "id"
_OPT_STR = "str?"
_OPT_INT = "int?"
_SHAPES: dict[str, tuple[str, ...]] = {
    "r": (_NUM, _OPT_NUM, _OPT_NUM, _OPT_STR),
    "o": (_NUM, _ID),
    "m": (_NUM, _ID, "str"),
    "c": (_NUM, _ID, _OPT_INT, _OPT_STR, _OPT_STR, _OPT_STR),
    "a": (_NUM, _ID),
    "z": (_ID, _NUM, _NUM),
    "at": ("dict",),
    "pr": ("dict",),
    "f": ("str",),
    "p": ("bool?",),
    "ow": (_NUM, _NUM),
    "up": (_NUM, _NUM, _NUM, _NUM),
    "s": (),
}
#: Events an earlier version wrote shorter, and their length then (what is missing is absent).
_SHORTER: dict[str, int] = {"up": 2}  # before the scrape's own time was traced


def _fits(kind: str, value: Any) -> bool:
    if kind in (_NUM, _OPT_NUM):
        if value is None:
            return kind == _OPT_NUM
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if kind == _ID:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == _OPT_INT:
        return value is None or (isinstance(value, int) and not isinstance(value, bool))
    if kind in ("str", _OPT_STR):
        return isinstance(value, str) or (value is None and kind == _OPT_STR)
    if kind == "bool?":
        return value is None or isinstance(value, bool)
    return isinstance(value, dict)


@dataclass
class Loaded:
    """A trace read from its files: its header, its events in order, and what was wrong."""

    files: list[Path]
    header: dict[str, Any]
    events: list[list[Any]]
    skipped: int = 0  # lines that were not an event nor a header
    truncated: bool = False  # the last line was cut short (a trace still being written)
    continues: bool = False  # its first file continues one rotated away
    lost: int = 0  # times the live buffer dropped events
    live_books: dict[str, float] | None = None
    notes: list[str] = field(default_factory=list)
    #: Where the first skipped lines are (``file:line (why)``), for people.
    skipped_at: list[str] = field(default_factory=list)


#: Skipped lines named one by one in the notes (the rest are counted).
NAMED = 5


def traces_in(directory: str | Path) -> list[Path]:
    """Every trace in ``directory`` (its current file; rotated parts go with it), by name."""
    found = sorted(p for p in Path(directory).glob("giul-trace-*.jsonl")
                   if not p.stem.split(".")[-1].isdigit())
    if not found:
        raise ConfigError(f"{str(directory)!r} is a directory with 0 traces", remedy=_REMEDY)
    return found


def trace_files(path: str | Path) -> list[Path]:
    """The files of the trace at ``path``, oldest first: its rotated parts, then itself. A
    directory holding one trace stands for it (:func:`traces_in` lists several)."""
    path = Path(path)
    if path.is_dir():
        found = traces_in(path)
        if len(found) != 1:
            listed = ", ".join(p.name for p in found[:5])
            raise ConfigError(
                f"{str(path)!r} is a directory with {len(found)} traces ({listed})",
                remedy="give the path of one trace file, or replay them all: giul-asgi replay DIR")
        path = found[0]
    if not path.is_file():
        raise ConfigError(f"no trace at {str(path)!r}", remedy=_REMEDY)
    parts: list[Path] = []
    part = 1
    while rotated(path, part).is_file():
        parts.append(rotated(path, part))
        part += 1
    return [*reversed(parts), path]


def load(path: str | Path) -> Loaded:
    """Read a trace (and its rotated parts), skipping and counting what cannot be read."""
    files = trace_files(path)
    header: dict[str, Any] | None = None
    events: list[list[Any]] = []
    skipped = 0
    truncated = False
    continues = False
    lost = 0
    books: dict[str, float] | None = None
    last_attach: list[Any] | None = None
    repeat_attach = False  # a continued file repeats the attach: not a new reader
    skipped_at: list[str] = []

    def skip(file: Path, number: int, why: str) -> None:
        nonlocal skipped
        skipped += 1
        if len(skipped_at) < NAMED:
            skipped_at.append(f"{file}:{number + 1} ({why})")

    for index, file in enumerate(files):
        try:
            text = file.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise ConfigError(f"cannot read trace {str(file)!r}: {exc}", remedy=_REMEDY) from None
        lines = text.split("\n")
        for number, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except RecursionError:  # "[[[[...": no event nests this deep
                skip(file, number, "nested too deeply to be a trace event")
                continue
            except ValueError:
                if index == len(files) - 1 and number == len(lines) - 1:
                    truncated = True  # no newline after it: cut while being written
                else:
                    skip(file, number, "not JSON")
                continue
            if isinstance(item, dict):
                if "giul_trace" in item:
                    if header is None:
                        header = item
                        continues = bool(item.get("part"))
                    repeat_attach = bool(item.get("part")) and last_attach is not None
                elif isinstance(item.get("books"), dict):
                    books = item["books"]
                elif "lost" in item:
                    lost += 1
                else:
                    skip(file, number, "an object that is not a header, books or lost")
                continue
            if not _event(item):
                skip(file, number, "not a trace event")
                continue
            if item[0] == "at":
                if repeat_attach and item == last_attach:
                    repeat_attach = False
                    continue
                last_attach = item
            repeat_attach = False
            events.append(item)
    if header is None:
        empty = all(f.stat().st_size == 0 for f in files)
        raise ConfigError(
            f"the trace {str(files[-1])!r} is empty" if empty
            else f"{str(files[-1])!r} has no trace header: not a giul-asgi trace",
            remedy="the node's reader thread writes its trace every 0.5 s and when the server "
                   "stops: wait, or stop the server, then replay" if empty else _REMEDY)
    if header.get("giul_trace") != VERSION:
        raise ConfigError(f"trace version {header.get('giul_trace')!r}, this giul-asgi reads {VERSION}",
                          remedy="replay it with the giul-asgi version that wrote it")
    loaded = Loaded(files, header, events, skipped, truncated, continues, lost, books,
                    skipped_at=skipped_at)
    if skipped:
        more = f", and {skipped - len(skipped_at)} more" if skipped > len(skipped_at) else ""
        loaded.notes.append(f"{skipped} line(s) were not trace events: skipped "
                            f"({'; '.join(skipped_at)}{more})")
    if truncated:
        loaded.notes.append("the last line was cut short (a trace still being written): skipped")
    if continues:
        loaded.notes.append("the trace's oldest part was rotated away: windows open when it "
                            "begins are not replayed, and the first figures may differ from live")
    if lost:
        loaded.notes.append("the live trace lost events (its buffer filled): replay will not agree")
    if any(event[0] == "up" and len(event) < 4 for event in events):
        loaded.notes.append("its upstream samples say no scrape time (an earlier giul-asgi wrote them), "
                            "and that version counted ours in them otherwise: replay may not agree")
    return loaded


def _event(item: Any) -> bool:
    if not isinstance(item, list) or not item or not isinstance(item[0], str):
        return False
    shape = _SHAPES.get(item[0])
    if shape is None or len(item) - 1 not in (len(shape), _SHORTER.get(item[0])):
        return False
    return all(_fits(kind, value) for kind, value in zip(shape, item[1:], strict=False))


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Recorded:
    """The live reader as its attach described it: replay never reads it."""

    blocking = False

    def __init__(self, about: dict[str, Any], clock: Callable[[], float]) -> None:
        kind = about.get("kind")
        self.kind: Kind = kind if kind in ("counter", "power", "none") else "counter"
        method = about.get("method")
        self.method: Literal["measured", "simulated"] = "simulated" if method == "simulated" else "measured"
        self.backend = str(about.get("backend", "none"))
        self.source = str(about.get("source", "none"))
        period = about.get("period_hint")
        self.period = float(period) if isinstance(period, int | float) and period > 0 else 0.1
        idle = about.get("idle_w")
        self.simulated_idle_w = float(idle) if isinstance(idle, int | float) else None
        mig = about.get("mig")  # what the live reader said of MIG, for mig_of
        slices = mig.get("slices") if isinstance(mig, dict) else None
        self.mig = isinstance(mig, dict)
        self.mig_slices = tuple(slices) if isinstance(slices, list) else None
        self.clock = clock

    def read(self) -> Reading:
        return Reading(t=self.clock(), error="a replayed reader is never read")

    def close(self) -> None:
        return None


@dataclass
class _Request:
    window: Window
    id: str | None = None
    route: str | None = None
    tier: str | None = None
    tokens: int | None = None
    live_j: float | None = None  # the raw share it settled with live


@dataclass
class Replayed:
    """What replay found: each request's figure, the node's books, and how it compares."""

    loaded: Loaded
    split: str
    live_split: str
    idle_w: float | None
    rows: list[dict[str, Any]]
    books: dict[str, float]
    groups: list[dict[str, Any]]
    agreement: dict[str, Any]
    unknown_windows: int = 0

    def as_dict(self) -> dict[str, Any]:
        loaded = self.loaded
        return {
            "source": "replay", "node": loaded.header.get("node"), "files": [str(f) for f in loaded.files],
            "events": len(loaded.events), "skipped_lines": loaded.skipped,
            "truncated": loaded.truncated, "continues": loaded.continues, "notes": loaded.notes,
            "split": self.split, "live_split": self.live_split, "idle_w": self.idle_w,
            "requests": self.rows, "books": self.books, "live_books": loaded.live_books,
            "by_route_tier": self.groups, "agreement": self.agreement,
        }


def replay(loaded: Loaded, *, split: str | None = None, idle_w: float | None = None) -> Replayed:
    """Run the trace's events through a fresh ledger (same tape and book, virtual clock)."""
    header = loaded.header
    live_split = str(header.get("split", "time"))
    split = split or live_split
    clock = _Clock()
    node_idle = idle_w if idle_w is not None else header.get("idle_w")
    reader_box: list[_Recorded] = []
    try:
        node = Node(
            str(header.get("node") or "replay"), gpus=(), idle_w=node_idle,
            period_s=header.get("period_s"), ramp_s=header.get("ramp_s", 0.1),
            foreign=header.get("foreign", "charge"), split=split,
            reader="auto" if header.get("measures", True) else "none",
            reader_factory=(lambda _node: reader_box[-1]) if header.get("measures", True) else None,
        )
    except ConfigError as exc:
        raise ConfigError(f"the trace's header does not describe a node: {exc.message}",
                          remedy="the header (its first line) was edited or damaged: " + _REMEDY) from None
    ledger = Ledger(node, split=split_for(split), clock=clock, poll=False)
    requests: dict[int, _Request] = {}
    done: list[_Request] = []
    unknown = 0
    for event in loaded.events:
        kind = event[0]
        if kind == "r":
            clock.now = event[1]
            ledger.ingest(Reading(event[1], event[2], event[3], event[4]))
        elif kind == "o":
            clock.now = event[1]
            requests[event[2]] = _Request(ledger.open())
        elif kind in ("m", "c", "a", "z"):
            request = requests.get(event[2] if kind != "z" else event[1])
            if request is None:
                unknown += kind == "c"
                continue
            if kind == "m":
                clock.now = event[1]
                ledger.mark(request.window, event[3])
            elif kind == "c":
                clock.now = event[1]
                request.tokens, request.id, request.route, request.tier = event[3:7]
                ledger.close(request.window, request.tokens)
                done.append(request)
            elif kind == "a":
                clock.now = event[1]
                ledger.abandon(request.window)
                requests.pop(event[2], None)
            else:
                request.live_j = event[2] + event[3]
        elif kind == "at":
            reader_box.append(_Recorded(event[1], clock))
            ledger.attach(reader_box[-1])
        elif kind == "pr":  # the prior an earlier worker of the server kept, as live restored it
            ledger.book.prior.restore(event[1])
        elif kind == "f":
            ledger.failed(GiulError(event[1]))
        elif kind == "p":
            ledger.book.note_processes(event[1])  # the verdict the live ledger reached
        elif kind == "k":  # a piece the card's holder decided: this process took its part
            piece = _taken(event[1])
            clock.now = max(clock.now, piece.t1)
            ledger.take([(piece, float(event[2]))])
        elif kind == "up":
            clock.now = event[1]
            ledger.note_upstream(event[1], event[2], *event[3:])  # an earlier version's: no more
        elif kind == "s":
            ledger.stop()
    rows = [_row(ledger, request) for request in done]
    totals = ledger.totals()
    books = {"measured_j": totals.measured_j, "charged_j": totals.charged_j,
             "unattributed_j": totals.unattributed_j, "in_flight_j": totals.in_flight_j,
             "estimated_j": totals.estimated_j}
    if unknown:
        loaded.notes.append(f"{unknown} window(s) closed that opened before the trace begins: not replayed")
    return Replayed(loaded, split, live_split, ledger.tape.idle_w if ledger.tape else node_idle,
                    rows, books, _groups(rows), _agreement(rows, split == live_split), unknown)


def _taken(event: list[Any]) -> CardSpan | Gap:
    """A piece from the card's holder, as the trace wrote it (``Ledger``'s ``k`` event)."""
    if event[0] == "g":
        return Gap(float(event[1]), float(event[2]), str(event[3]), bool(event[4]))
    return CardSpan(*event[1:])


def _row(ledger: Ledger, request: _Request) -> dict[str, Any]:
    window = request.window
    share = ledger.share(window)
    energy = grade(share, node=ledger.node.name, tier=request.tier, route=request.route,
                   tokens=request.tokens, id=request.id)
    raw = window.share + window.fill_j if window.settled and share.joules is not None else None
    diff = None
    if raw is not None and request.live_j is not None:
        scale = max(abs(raw), abs(request.live_j), 1e-300)
        diff = abs(raw - request.live_j) / scale
    return {
        "id": request.id, "route": request.route, "tier": request.tier, "tokens": request.tokens,
        "joules": energy.joules, "uncertainty_joules": energy.uncertainty_joules,
        "method": energy.method, "backend": energy.backend, "source": "replay",
        "settled": energy.settled, "split": energy.split, "seconds": energy.seconds,
        "error": energy.error, "mig": energy.mig, "raw_j": raw, "live_raw_j": request.live_j,
        "relative_difference": diff,
    }


def _groups(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per route and tier: requests, the joules replay charges and those live charged."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        key = (str(row["route"]), str(row["tier"]))
        group = groups.setdefault(key, {"route": row["route"], "tier": row["tier"], "requests": 0,
                                        "replay_j": 0.0, "live_j": 0.0, "compared": 0})
        group["requests"] += 1
        if row["raw_j"] is not None and row["live_raw_j"] is not None:
            group["compared"] += 1
            group["replay_j"] += row["raw_j"]
            group["live_j"] += row["live_raw_j"]
    for group in groups.values():
        group["ratio"] = group["replay_j"] / group["live_j"] if group["live_j"] > 0 else None
    return sorted(groups.values(), key=lambda g: -g["live_j"])


def _agreement(rows: list[dict[str, Any]], same_split: bool) -> dict[str, Any]:
    diffs = [row["relative_difference"] for row in rows if row["relative_difference"] is not None]
    return {
        "same_split": same_split, "compared": len(diffs),
        "within": sum(1 for d in diffs if d <= AGREES), "tolerance": AGREES,
        "max_relative_difference": max(diffs) if diffs else None,
        "not_settled_live": sum(1 for row in rows if row["live_raw_j"] is None),
    }


def _j(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.4g}"


def render(result: Replayed) -> str:
    """The replay for people: each request, the books, and the comparison with live."""
    loaded = result.loaded
    out = [f"replay of {loaded.files[-1]} ({len(loaded.files)} file(s), {len(loaded.events)} events)"
           f"  source: replay",
           f"node {loaded.header.get('node')}: split {result.split} (live: {result.live_split}), "
           f"idle floor {_j(result.idle_w)} W"]
    out += [f"  note: {note}" for note in loaded.notes]
    out.append(f"{'id':<28} {'route':<20} {'tier':<10} {'tokens':>7} {'joules':>10} {'+-':>9} "
               f"{'method':<9} {'live J':>10}")
    for row in result.rows:
        out.append(f"{row['id'] or '-':<28} {row['route'] or '-':<20} {row['tier'] or '-':<10} "
                   f"{row['tokens'] if row['tokens'] is not None else '-':>7} {_j(row['joules']):>10} "
                   f"{_j(row['uncertainty_joules']):>9} {row['method']:<9} "
                   f"{_j(row['live_raw_j']) if row['raw_j'] is not None else '-':>10}")
    books, live = result.books, loaded.live_books
    out.append(f"books: measured {books['measured_j']:.6g} J above idle, charged {books['charged_j']:.6g} J, "
               f"unattributed {books['unattributed_j']:.6g} J, in flight {books['in_flight_j']:.6g} J")
    if live and live.get("received_j", 0) > 0 and not live.get("measured_j"):
        # A seat at the card's table: its holder read the card and shared each span; this
        # process's books say what it received of them (a stranger read "measured 0 J").
        out.append(f"live books: received {live['received_j']:.6g} J above idle from the card's "
                   f"holder, charged {live.get('charged_j', 0):.6g} J, unattributed "
                   f"{live.get('unattributed_j', 0):.6g} J")
    elif live:
        out.append(f"live books: measured {live.get('measured_j', 0):.6g} J, charged "
                   f"{live.get('charged_j', 0):.6g} J, unattributed {live.get('unattributed_j', 0):.6g} J")
    agreement = result.agreement
    if agreement["same_split"]:
        worst = agreement["max_relative_difference"]
        out.append(f"agreement with live: {agreement['within']} of {agreement['compared']} settled "
                   f"request(s) within {AGREES:g} (largest relative difference "
                   f"{'n/a' if worst is None else f'{worst:.2g}'})")
    else:
        out.append(f"by route and tier: split {result.split} against live {result.live_split}")
        out.append(f"  {'route':<20} {'tier':<10} {'requests':>8} {'live J':>10} "
                   f"{'replay J':>10} {'ratio':>7}")
        for group in result.groups:
            ratio = group["ratio"]
            out.append(f"  {group['route']!s:<20} {group['tier']!s:<10} {group['requests']:>8} "
                       f"{group['live_j']:>10.4g} {group['replay_j']:>10.4g} "
                       f"{'-' if ratio is None else f'{ratio:.3f}':>7}")
    return "\n".join(out)


def command(target: str | Path, *, split: str | None = None, idle_w: float | None = None,
            as_json: bool = False) -> int:
    """``giul-asgi replay TARGET``: a trace file, or a directory of traces, each replayed in
    turn. A trace that cannot be replayed is said (with its remedy) and the others still are;
    the status is 2 when none could be (a ConfigError for a single one, as before)."""
    path = Path(target)
    if not path.is_dir():
        return _print([_one(path, split, idle_w)], as_json)
    results: list[Replayed] = []
    failed = 0
    for file in traces_in(path):
        try:
            results.append(_one(file, split, idle_w))
        except ConfigError as exc:
            failed += 1
            print(f"giul-asgi replay: {file}: {exc.message}", file=sys.stderr)
            if exc.remedy:
                print(f"  -> {exc.remedy}", file=sys.stderr)
    if not results:
        raise ConfigError(f"none of the {failed} trace(s) in {str(path)!r} could be replayed",
                          remedy=_REMEDY)
    return _print(results, as_json)


def _one(path: Path, split: str | None, idle_w: float | None) -> Replayed:
    result = replay(load(path), split=split, idle_w=idle_w)
    for note in result.loaded.notes:
        print(f"giul-asgi replay: {result.loaded.files[-1]}: {note}", file=sys.stderr)
    return result


def _print(results: list[Replayed], as_json: bool) -> int:
    if as_json:  # one trace: its document, as ever; several: one document listing them
        doc: Any = (results[0].as_dict() if len(results) == 1
                    else {"source": "replay", "traces": [r.as_dict() for r in results]})
        print(json.dumps(doc, indent=2))
    else:
        print("\n\n".join(render(r) for r in results))
    return 0


__all__ = ["AGREES", "Loaded", "Replayed", "command", "load", "render", "replay", "trace_files",
           "traces_in"]
