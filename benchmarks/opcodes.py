"""Python opcodes a request executes, by function: where a request's path goes, counted the same every run.

benchmarks/ledger_path.py's ``--asgi`` path (one thread, a virtual clock, the reader's work done
in the same thread between requests) runs ``n`` requests of one kind through one of
benchmarks/_apps.py's stacks under ``sys.settrace`` with opcode events on. Each function's
opcodes and calls are divided by ``n``. By default only the requests are counted; ``--reader``
counts the reader's booking between them too (the warm-up's windows settle in the counted span,
so its per-request figures are a little high: about n + 100 windows over n requests).
``--seconds-ms`` makes ours' requests last on the virtual clock, the readings booked meanwhile
counted only with ``--reader``: a window of a millisecond or more gets a guessed first figure, as
an LLM request's does, where the benchmark app's microseconds say unknown.

Opcodes are not time (a C call is one opcode whatever it costs), but on this path a request's
time follows them closely (a stream's chunk: 7.4 ns an opcode on the 2-core VM), they do not move
with the machine's load, and they name the Python function that spent them: callgrind
(benchmarks/instructions.py) counts the whole, this says where.

    python benchmarks/opcodes.py giul-asgi 300
    python benchmarks/opcodes.py prometheus-fastapi-instrumentator 300
    python benchmarks/opcodes.py giul-asgi 300 --reader --top 60
    python benchmarks/opcodes.py giul-asgi 100 --kind stream --chunks 110
    python benchmarks/opcodes.py giul-asgi 1500 --seconds-ms 20
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ledger_path
import overhead

Key = tuple[str, str]


def _where(frame: FrameType) -> Key:
    code = frame.f_code
    name = code.co_filename.split("site-packages/")[-1]
    for root in sys.path:
        if root and name.startswith(root + "/"):
            name = name[len(root) + 1:]
            break
    if name == "<string>":  # a dataclass's generated __init__: named by its class
        return name, f"{type(frame.f_locals.get('self')).__name__}.{code.co_name}"
    return name, code.co_name


def count(variant: str, n: int, kind: str, chunks: int, reader: bool,
          seconds: float = 0.0) -> tuple[Any, Any]:
    """(opcodes, calls) by (file, function), totals over ``n`` requests."""
    opcodes: collections.Counter[Key] = collections.Counter()
    calls: collections.Counter[Key] = collections.Counter()
    on = [False]

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        if not on[0]:
            return None
        frame.f_trace_opcodes = True
        key = _where(frame)
        calls[key] += 1

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "opcode":
                opcodes[key] += 1
            return local

        return local

    run_requests = overhead.run_requests
    seen = [0]

    async def counted(app: Any, path: str, n: int) -> float:
        seen[0] += 1
        if seen[0] == 1:  # the warm-up
            return await run_requests(app, path, n)
        on[0] = True
        try:
            return await run_requests(app, path, n)
        finally:
            on[0] = reader  # the booking between requests, where asked for

    read = ledger_path._Lasting.read

    def read_uncounted(lasting: Any) -> None:  # the readings booked while a request lasts
        was, on[0] = on[0], reader
        try:
            read(lasting)
        finally:
            on[0] = was

    overhead.run_requests = counted
    ledger_path._Lasting.read = read_uncounted  # type: ignore[method-assign,assignment]
    sys.settrace(tracer)
    try:
        asyncio.run(ledger_path.run_asgi(variant, n, 60e-6, kind=kind, chunks=chunks, seconds_s=seconds))
    finally:
        sys.settrace(None)
        overhead.run_requests = run_requests
        ledger_path._Lasting.read = read  # type: ignore[method-assign]
    return opcodes, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variant")
    parser.add_argument("n", type=int)
    parser.add_argument("--kind", default="json", choices=("json", "stream", "usage"))
    parser.add_argument("--chunks", type=int, default=1000, help="a stream's chunks")
    parser.add_argument("--reader", action="store_true", help="count the reader's booking too")
    parser.add_argument("--top", type=int, default=40, help="functions listed")
    parser.add_argument("--seconds-ms", type=float, default=0.0,
                        help="ours: each request lasts this long on the virtual clock (an upstream's "
                             "answer; under 1 ms no first figure is guessed)")
    args = parser.parse_args()
    opcodes, calls = count(args.variant, args.n, args.kind, args.chunks, args.reader, args.seconds_ms / 1e3)
    what = "requests and the reader's booking" if args.reader else "requests only"
    print(f"{args.variant}, {args.kind}: {sum(opcodes.values()) / args.n:.0f} opcodes a request ({what})")
    print()
    print("| opcodes a request | calls a request | function |")
    print("|---:|---:|---|")
    for key, value in opcodes.most_common(args.top):
        print(f"| {value / args.n:.1f} | {calls[key] / args.n:.2f} | {key[0]}:{key[1]} |")


if __name__ == "__main__":
    main()
