"""What a node on MIG slices can and cannot say about its figures, said in one place.

Power and energy are board-level: a MIG slice cannot be metered alone. A node that stands
for slices of a board reads the whole board, so its figures are the board's energy shared
among this node's windows, and work on the board's other slices is load these windows did
not ask for. Until now only ``giul-asgi probe`` and the reader's notes said so; an operator
reading a record, ``/energy`` or a Prometheus series could not tell. The readers know
whether a board is in MIG mode (``mig``) and which GPU instances the operator said the node
stands for (``options.mig_slices``); :func:`mig_of` turns that into the one caveat every
record (``mig``), the node's ``/energy`` ledger block and ``giul_node_mig_info`` carry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Mig:
    """A node on MIG: the slices it stands for (None: not named), and the caveat in words."""

    slices: tuple[int, ...] | None
    caveat: str

    @property
    def label(self) -> str:
        """The slices for a metric label: ``1,2``, or ``unnamed``."""
        return ",".join(str(s) for s in self.slices) if self.slices else "unnamed"

    def as_dict(self) -> dict[str, Any]:
        return {"slices": list(self.slices) if self.slices is not None else None,
                "caveat": self.caveat}


def mig_of(reader: object) -> Mig | None:
    """The node's MIG caveat from its reader (None: not on MIG, or nobody can tell)."""
    slices = getattr(reader, "mig_slices", None)
    on = getattr(reader, "mig", None) is True
    if slices is None and not on:
        return None
    board = "board-level energy (a MIG slice cannot be metered alone)"
    if slices is None:
        return Mig(None, f"MIG, slices not named: {board}; name them with options mig_slices")
    slices = tuple(int(s) for s in slices)
    return Mig(slices, f"MIG slices {list(slices)}: {board}; the board's other slices draw on it too")


__all__ = ["Mig", "mig_of"]
