"""RAPL: CPU package (and, on request, DRAM) energy for CPU inference nodes, from powercap sysfs.

``/sys/class/powercap/intel-rapl:N/energy_uj`` is a cumulative microjoule counter per CPU
package (AMD CPUs publish theirs under the same ``intel-rapl`` control type). It wraps at
``max_energy_range_uj``; we unwrap it, which is right as long as we read more often than
one wrap (hundreds of seconds at full load; the poller reads every period).

Sub-zones (``intel-rapl:N:M``: ``core``, ``uncore``, ``dram``) are parts *of* the package
energy or, for DRAM, beside it: we never add a sub-zone into its package. ``domain="dram"``
reads the DRAM zones alone; ``psys`` and the duplicate ``intel-rapl-mmio`` zones are left out.

Since Linux 5.10 ``energy_uj`` is readable by root only (CVE-2020-8694), and containers
often mask ``/sys/class/powercap``: both are reported as :class:`ReaderUnavailable` with the
reason, never as zero energy.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..errors import ReaderUnavailable
from .base import Kind, ReaderSpec, Reading
from .options import Options

OPTIONS = ("root", "domain", "packages")
DEFAULT_ROOT = "/sys/class/powercap"
_TOP = re.compile(r"^intel-rapl:(\d+)$")
_SUB = re.compile(r"^intel-rapl:(\d+):(\d+)$")
POLL_HINT_S = 0.1


@dataclass(slots=True)
class Zone:
    path: Path
    name: str
    max_uj: int
    last_uj: int = 0
    total_uj: int = 0


def _read_int(path: Path) -> int:
    return int(path.read_text().strip())


def _unavailable(zone: Path, exc: OSError) -> ReaderUnavailable:
    if isinstance(exc, PermissionError):
        return ReaderUnavailable(
            f"{zone / 'energy_uj'} is not readable: root only since Linux 5.10 (CVE-2020-8694)",
            remedy="run as root, or grant read access (a udev rule or chmod on energy_uj); in a "
            "container mount /sys/class/powercap read-only and give the user access",
        )
    return ReaderUnavailable(f"cannot read {zone}: {exc}")


def find_zones(root: Path, domain: str, packages: tuple[int, ...] | None) -> list[tuple[Path, str]]:
    """(zone directory, name) of every package zone, or every DRAM zone, under ``root``."""
    found: list[tuple[Path, str]] = []
    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        top = _TOP.match(entry.name)
        if top is None:
            continue
        try:
            name = (entry / "name").read_text().strip()
        except OSError:
            continue
        if not name.startswith("package"):
            continue  # psys and friends are not a package
        index = int(name.split("-")[-1]) if name.split("-")[-1].isdigit() else int(top.group(1))
        if packages is not None and index not in packages:
            continue
        if domain == "package":
            found.append((entry, name))
            continue
        for sub in sorted(entry.iterdir()):
            if _SUB.match(sub.name):
                try:
                    if (sub / "name").read_text().strip() == "dram":
                        found.append((sub, f"{name}/dram"))
                except OSError:
                    continue
    return found


class RaplReader:
    """Sums the node's RAPL package zones (or DRAM zones) into one unwrapped counter.

    Options: ``root`` (``/sys/class/powercap``), ``domain`` (``package`` | ``dram``),
    ``packages`` (package indices, default all).
    """

    backend = "rapl"
    source = "local"
    #: A CPU node's energy, not a card's (what every figure's ``boundary`` says).
    boundary = "cpu"
    method: Literal["measured", "simulated"] = "measured"
    kind: Kind = "counter"

    def __init__(self, spec: ReaderSpec) -> None:
        opts = Options(spec.options, "rapl", OPTIONS)
        root = Path(opts.text("root", DEFAULT_ROOT) or DEFAULT_ROOT)
        self.domain = opts.choice("domain", ("package", "dram"), "package")
        packages = opts.ints("packages")
        self.clock: Callable[[], float] = spec.clock
        self.period = spec.period or POLL_HINT_S
        if not root.is_dir():
            raise ReaderUnavailable(
                f"no powercap tree at {root}",
                remedy="RAPL needs Linux with intel_rapl (Intel, or AMD Zen); in a container mount "
                "/sys/class/powercap, or use another reader",
            )
        zones = find_zones(root, self.domain, packages)
        if not zones:
            raise ReaderUnavailable(
                f"no RAPL {self.domain} zone under {root}",
                remedy="check the intel_rapl_common module is loaded, or the packages option")
        self.zones: list[Zone] = []
        for path, name in zones:
            try:
                max_uj = _read_int(path / "max_energy_range_uj")
                first = _read_int(path / "energy_uj")
            except OSError as exc:
                raise _unavailable(path, exc) from None
            except ValueError:
                raise ReaderUnavailable(f"{path / 'energy_uj'} does not hold a number") from None
            self.zones.append(Zone(path, name, max_uj, last_uj=first, total_uj=first))
        self.notes = [f"RAPL {self.domain} zones: {', '.join(z.name for z in self.zones)}"]

    def read(self) -> Reading:
        try:
            for zone in self.zones:
                raw = _read_int(zone.path / "energy_uj")
                step = raw - zone.last_uj
                if step < 0:  # wrapped at max_energy_range_uj
                    if zone.max_uj <= 0 or raw > zone.max_uj:
                        zone.last_uj = raw
                        return Reading(t=self.clock(), error=f"{zone.name}: counter fell with no wrap range")
                    step += zone.max_uj
                zone.total_uj += step
                zone.last_uj = raw
        except (OSError, ValueError) as exc:
            return Reading(t=self.clock(), error=f"{type(exc).__name__}: {exc}")
        return Reading(t=self.clock(), joules=sum(z.total_uj for z in self.zones) / 1e6)

    def close(self) -> None:
        return None


__all__ = ["RaplReader", "find_zones"]
