"""What keeping a record by id costs on the request path: memory, and memory plus the ring.

``RecordStore.put(energy, block)`` runs before each answer goes (the first figure, with the
JSON block the answer carries anyway): a dict insert under a lock, then, where records are
shared, one copy into this process's memory-mapped ring (:mod:`giul_asgi.hostshare.ring`).
This times ``put`` alone in CPU time of the calling thread (a loaded machine's other
processes do not count; best of ``--repeats`` runs of ``--n`` records, a realistic record
of about 600 bytes), without the ring (``share=False``) and with it, and the settled figure's
write on the reader thread (``settled``: the JSON made there too). Also the old design for
reference where it applies: nothing was written on the request path then (a queue). And a
lookup of another process's record: the first indexes that process's whole ring, later ones
read only what was written since.

    .venv/bin/python benchmarks/records_put.py [--n 20000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time

from giul_asgi.energy import Energy
from giul_asgi.listeners import Settled
from giul_asgi.meter import id_prefix
from giul_asgi.records import RecordStore
from giul_asgi.wire.body import energy_json


def record(i: int) -> Energy:
    return Energy(joules=12.345678 + i * 1e-6, method="measured", backend="nvml_counter",
                  source="local", node="gpu0", tier="large", route="/v1/chat/completions",
                  seconds=0.2345, idle_watts=60.0, mean_watts=200.1234, tokens=128,
                  uncertainty_joules=0.123, settled=False, id=f"{id_prefix()}{i:x}")


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.thread_time()
        fn()
        times.append(time.thread_time() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--before", metavar="DIR",
                        help="an earlier commit's giul_asgi (git archive'd there): its put with the "
                             "ring timed beside this checkout's, interleaved, and nothing else")
    args = parser.parse_args()
    if args.before:
        before(args.before, args.n, args.repeats)
        return
    n = args.n
    place = tempfile.mkdtemp(prefix="giul-bench-")
    os.chmod(place, 0o700)
    energies = [record(i) for i in range(1, n * args.repeats + 1)]
    blocks = [energy_json(e) for e in energies]
    rows = []
    for label, share in (("memory only (share=False)", False), ("memory + ring", place)):
        store = RecordStore(max_records=n, share=share)
        assert store.wait_ready(30)
        it = iter(range(len(energies)))

        def run(store: RecordStore = store, it=it) -> None:
            for _ in range(n):
                i = next(it)
                store.put(energies[i], blocks[i])

        seconds = best(run, args.repeats)
        rows.append((label + (", shared" if store.shared else ", not shared"), seconds / n * 1e6))
        store.close()
    store = RecordStore(max_records=n, share=place)
    assert store.wait_ready(30)
    settled = [Settled(Energy(**{**e.__dict__, "settled": True}) if hasattr(e, "__dict__") else e)
               for e in energies[:n]]
    seconds = best(lambda: store.settled(settled), 1)
    rows.append(("settled(batch) with the ring, JSON made there, per record", seconds / n * 1e6))
    # A lookup of another process's record: the first reads (indexes) its whole ring, a
    # later one only what was written since.
    from giul_asgi.hostshare.server import ServerId

    server = ServerId("lbench", "the benchmark's", (os.getpid(), None))
    writer = RecordStore(max_records=n, share=place, server=server)
    reader = RecordStore(max_records=n, share=place, server=server)
    assert writer.wait_ready(30) and reader.wait_ready(30)
    for i in range(len(energies)):  # fills its ring (and laps it)
        writer.put(energies[i], blocks[i])
    t0 = time.perf_counter()
    assert reader.get(energies[-1].id) is not None
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(1, 101):
        reader.get(energies[-i].id)
    warm = (time.perf_counter() - t0) / 100
    ring = writer.journal.ring  # type: ignore[union-attr]
    entries = len(ring.entries(0)[0])
    rows.append((f"lookup in another process's full ring ({entries} records, "
                 f"{ring.capacity >> 20} MiB), first (indexes it), ms", cold * 1e3))
    rows.append(("lookup, later ones, ms", warm * 1e3))
    blob = blocks[0]
    seconds = best(lambda: [energy_json(e) for e in energies[:n]], args.repeats)
    rows.append(("(for scale) energy_json alone, per record", seconds / n * 1e6))
    print(f"# records_put, {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"machine: {platform.machine()} {platform.processor() or ''} {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.2f}; "
          f"record {len(blob)} bytes of JSON, {n} records a run, best of {args.repeats}")
    print()
    print("| what | us per record (ms where said) |")
    print("|---|---:|")
    for label, us in rows:
        print(f"| {label} | {us:.2f} |")


def before(folder: str, n: int, repeats: int) -> None:
    """``put`` with the ring, this checkout's and ``folder``'s, interleaved: each arm's own
    store filling (and lapping) its own ring, best of ``repeats`` runs of ``n`` records."""
    import importlib

    from _apps import BEFORE, prepare_before

    prepare_before(folder)
    arms = {"before": importlib.import_module(f"{BEFORE}.records").RecordStore, "this checkout": RecordStore}
    place = tempfile.mkdtemp(prefix="giul-bench-")
    os.chmod(place, 0o700)
    energies = [record(i) for i in range(1, n * (2 * repeats + 2) + 1)]
    blocks = [energy_json(e) for e in energies]
    stores = {name: store_type(max_records=n, share=place) for name, store_type in arms.items()}
    for store in stores.values():
        assert store.wait_ready(30) and store.shared
    it = iter(range(len(energies)))
    for store in stores.values():  # each ring full before the timing starts
        for _ in range(n):
            i = next(it)
            store.put(energies[i], blocks[i])
    times: dict[str, list[float]] = {name: [] for name in stores}
    for r in range(repeats):
        for name in (list(stores) if r % 2 == 0 else list(stores)[::-1]):
            store = stores[name]
            t0 = time.thread_time()
            for _ in range(n):
                i = next(it)
                store.put(energies[i], blocks[i])
            times[name].append((time.thread_time() - t0) / n * 1e6)
    print(f"# records_put --before, {time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}, "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}, load average "
          f"{os.getloadavg()[0]:.2f}; {n} records a run into a full ring, {repeats} interleaved runs\n")
    print("| arm | put with the ring, us a record (best) | median | runs |")
    print("|---|---:|---:|---|")
    for name, values in times.items():
        print(f"| {name} | {min(values):.2f} | {sorted(values)[len(values) // 2]:.2f} | "
              f"{' '.join(f'{v:.2f}' for v in values)} |")


if __name__ == "__main__":
    main()
