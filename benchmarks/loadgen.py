"""The HTTP load generator the server benchmarks drive: wrk where installed, else autocannon.

benchmarks/overhead.py's part (b) and benchmarks/gateway.py time a server under a closed loop
of 16 connections. wrk (Debian's ``wrk``) is what they were written for; where it is not
installed (the project's VMs: no apt), autocannon (``npm install -g autocannon``, Node.js)
does the same job. The two differ (wrk is C, autocannon JavaScript, each on one core beside
the server), so a run says which it used and ratios are only read within one run.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess


def tool() -> str | None:
    """``wrk``, ``autocannon``, or None where neither is installed."""
    for name in ("wrk", "autocannon"):
        if shutil.which(name) is not None:
            return name
    return None


def describe(seconds: int, connections: int = 16) -> str:
    """The load's command line, for a result's header."""
    name = tool()
    if name == "wrk":
        return f"wrk -t1 -c{connections} -d{seconds}s"
    return f"autocannon -c {connections} -d {seconds}"


def rps(url: str, seconds: int, connections: int = 16) -> tuple[float, int]:
    """(requests/s, requests served) from one run against ``url``."""
    name = tool()
    if name == "wrk":
        out = subprocess.run(
            ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", url],
            capture_output=True, text=True, check=True,
        ).stdout
        rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
        count = re.search(r"(\d+) requests in", out)
        if not rate or not count:
            raise RuntimeError(f"wrk said: {out}")
        return float(rate.group(1)), int(count.group(1))
    if name == "autocannon":
        out = subprocess.run(
            ["autocannon", "-c", str(connections), "-d", str(seconds), "-j", url],
            capture_output=True, text=True, check=True,
        ).stdout
        data = json.loads(out)
        if data.get("errors") or data.get("non2xx"):
            raise RuntimeError(f"autocannon saw {data.get('errors')} errors, {data.get('non2xx')} non-2xx")
        served = int(data["requests"]["total"])
        return served / float(data["duration"]), served
    raise RuntimeError("no load generator: install wrk (apt-get install wrk) or autocannon "
                       "(npm install -g autocannon)")


__all__ = ["describe", "rps", "tool"]
