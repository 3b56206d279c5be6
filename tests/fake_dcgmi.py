"""A stand-in for the ``dcgmi`` command: ``dmon`` output as DCGM prints it, and its failures.

Run as ``dcgmi dmon -e 155,156 -d <ms> [-i 0,1]`` (a test puts a ``dcgmi`` wrapper on PATH).
It prints the header (``#Entity`` and the fields' short names), the units line (``ID``),
then one row per GPU every ``<ms>``: ``GPU <id>  <watts>  <total energy mJ>``, the header
again every 10 samples. What each launch does comes from ``$FAKE_DCGMI_MODE``, a comma list
used in turn (the launch count is kept in ``$FAKE_DCGMI_STATE``; the last mode repeats):

- ``ok``: stream until killed;
- ``die:N``: N samples, then exit 1 with nothing said (a crash);
- ``hostengine``: the host engine's connection error, exit 255;
- ``inuse``: the watch is held by another client, exit 1;
- ``reserve``: the fields cannot be watched, exit 1;
- ``garbage``: lines that are not dmon output, then exit 3;
- ``na``: GPU 1's total energy is N/A (power still given);
- ``hang``: the header, then nothing;
- ``silent:N``: N samples, then nothing, without exiting (a wedged host engine); its pid
  is appended to ``$FAKE_DCGMI_SILENT`` once it has fallen silent.

Each launch's arguments are appended to ``$FAKE_DCGMI_ARGS`` (one line each), and its pid
to ``$FAKE_DCGMI_PIDS``. With ``$FAKE_DCGMI_CHILD`` set, each launch first starts a helper
process of its own that sleeps (its pid goes to ``$FAKE_DCGMI_PIDS`` too), as a real tool's
helpers would: it must go when dmon's process group is ended.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

HEADER = ("#Entity   POWER             TOTEC             ", "ID        W                 mJ                ")


def main(argv: list[str]) -> int:
    state = os.environ.get("FAKE_DCGMI_STATE")
    launch = 0
    if state:
        try:
            with open(state) as fh:
                launch = int(fh.read() or 0)
        except FileNotFoundError:
            launch = 0
        with open(state, "w") as fh:
            fh.write(str(launch + 1))
    if os.environ.get("FAKE_DCGMI_PIDS"):
        pids = [os.getpid()]
        if os.environ.get("FAKE_DCGMI_CHILD"):
            helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
            pids.append(helper.pid)
        with open(os.environ["FAKE_DCGMI_PIDS"], "a") as fh:
            fh.write("".join(f"{pid}\n" for pid in pids))
    if os.environ.get("FAKE_DCGMI_ARGS"):
        with open(os.environ["FAKE_DCGMI_ARGS"], "a") as fh:
            fh.write(" ".join(argv) + "\n")
    modes = os.environ.get("FAKE_DCGMI_MODE", "ok").split(",")
    mode = modes[min(launch, len(modes) - 1)]
    if not argv or argv[0] != "dmon":
        print(f"Usage: dcgmi subsystem, got {argv!r}")
        return 2
    args = dict(zip(argv[1::2], argv[2::2], strict=False))
    interval = int(args.get("-d", "1000")) / 1000.0
    gpus = [int(g) for g in args.get("-i", "0").split(",")]
    out = sys.stdout
    if mode == "hostengine":
        out.write("Error: unable to establish a connection to the specified host: localhost\n"
                  "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.\n")
        return 255
    if mode == "inuse":
        out.write("Error setting watches. Result: The requested operation could not be completed because "
                  "the affected resource is in use.\n")
        return 1
    if mode == "reserve":
        out.write("Error: Failed to set watches for the field group. Return: Insufficient permissions\n")
        return 1
    if mode == "garbage":
        out.write("\x1b[2J Segmentation handler installed\nloading libdcgm.so.4 ... ok?\n%%%% 12 ab\n")
        out.flush()
        return 3
    energy = {g: 123_456_789 + 1_000_000 * g for g in gpus}
    sample = 0
    limit = int(mode.split(":")[1]) if mode.startswith(("die:", "silent:")) else None
    for line in HEADER:
        out.write(line + "\n")
    out.flush()
    if mode == "hang":
        time.sleep(3600)
        return 0
    while limit is None or sample < limit:
        if sample and sample % 10 == 0:
            for line in HEADER:
                out.write(line + "\n")
        for g in gpus:
            watts = 60.0 + 5.0 * g + (sample % 3)
            energy[g] += int(watts * interval * 1000)
            total = "N/A" if mode == "na" and g == 1 else str(energy[g])
            out.write(f"GPU {g:<6}{watts:<18.3f}{total:<18}\n")
        out.flush()
        sample += 1
        time.sleep(interval)
    if mode.startswith("silent:"):
        if os.environ.get("FAKE_DCGMI_SILENT"):
            with open(os.environ["FAKE_DCGMI_SILENT"], "a") as fh:
                fh.write(f"{os.getpid()}\n")
        time.sleep(3600)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
