"""What a node has learnt of its card, kept in the place for the same server's next worker.

A worker's first figures rest on its node's prior (:mod:`giul_asgi.ledger.prior`): the rate
its windows were charged at and how far its guesses fell. gunicorn's ``--max-requests``, and
any server that replaces its workers, makes each worker start that from nothing, and a new
worker on an in-process card (the simulated one) answered its first requests unknown: a
fifth to a half of all answers in a stranger's trial. So each worker writes its prior here
every few seconds and when it stops, and a new worker of the same server starts from the
last one another process wrote (:meth:`KeptPrior.load`), before its first request. (A
process's own later ledgers of the node, as a test suite or an app built twice makes, start
from nothing, as they always did.)

``priors/<server folder>/<node>-<hash>.json``: one small file (a few kB) per node of each
server, replaced atomically by whichever worker writes last; the hash is of what makes a
prior mean the same (the node's name, idle floor, ramp, GPUs and reader), so a node changed
between two starts of a worker never starts from the old one's. A dead server's folder (its
keeper in its name is gone) is removed by the next worker to look. Nothing in it is trusted:
a state that makes no sense is not restored (:meth:`Prior.restore` checks).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import stat
from pathlib import Path
from typing import Any

from .place import make_dir, open_file, own_entries
from .rows import alive, load_json, me, replace
from .server import ServerId, keeper_in

log = logging.getLogger("giul_asgi.hostshare")

PRIORS = "priors"
#: A kept prior larger than this is not read (a state is a few kB).
MOST_BYTES = 64 * 1024


def prior_name(node: str, *meaning: object) -> str:
    """A node's file: its name made safe, and a hash of what makes its prior mean the same."""
    digest = hashlib.sha256(repr((node, *meaning)).encode()).hexdigest()[:12]
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', node)[:40]}-{digest}.json"


class KeptPrior:
    """One node's kept prior, for one server. Raises OSError where its folder cannot be made."""

    def __init__(self, place: Path, server: ServerId, name: str) -> None:
        root = place / PRIORS
        folder = make_dir(root / server.folder, root=place)
        self.path = folder / name
        _sweep(root, server.folder)

    def load(self) -> Any:
        """The state another process kept last (plain JSON values), or None: none kept, this
        process's own, or not readable."""
        try:
            fd = open_file(self.path, os.O_RDONLY)
        except OSError:
            return None
        try:
            raw = os.read(fd, MOST_BYTES + 1)
        except OSError:
            return None
        finally:
            os.close(fd)
        if len(raw) > MOST_BYTES:
            return None
        try:
            kept = load_json(raw)
        except ValueError:
            return None
        if not isinstance(kept, dict) or kept.get("by") == me() or "prior" not in kept:
            return None
        return kept["prior"]

    def save(self, state: Any) -> None:
        """Keep ``state`` (atomically); never raises (a full place costs the next worker its
        head start, nothing else)."""
        try:
            data = {"by": me(), "prior": state}
            replace(self.path, json.dumps(data, separators=(",", ":"), allow_nan=False).encode())
        except (OSError, ValueError) as exc:
            log.debug("the node's prior could not be kept in %s: %s", self.path, exc)



def _sweep(root: Path, ours: str) -> None:
    """Remove the folders of servers whose keeper is gone."""
    for entry, info in own_entries(root):
        if entry.name == ours or not stat.S_ISDIR(info.st_mode):
            continue
        keeper = keeper_in(entry.name)
        if keeper is not None and not alive(*keeper):
            with contextlib.suppress(OSError):
                shutil.rmtree(entry.path)


__all__ = ["PRIORS", "KeptPrior", "prior_name"]
