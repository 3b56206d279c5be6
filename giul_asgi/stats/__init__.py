"""The statistics of settled figures: what /energy and /metrics report.

Parts, each named for what it holds: :mod:`.labels` (the key a record counts under, and
its bound), :mod:`.sketch` (the quantile sketch), :mod:`.cell` (one key's counters and
sketches in one slot), :mod:`.rolling` (windows as rings of slots), :mod:`.stats`
(:class:`EnergyStats`, the listener that records), :mod:`.contract` (what the endpoint and
the exporters read of them), :mod:`.groups` (the groups /energy shows, merged from keys at
read and kept between reads), :mod:`.snapshot` (the JSON /energy serves, built at read
time), :mod:`.nodes` (the ledgers' samples for the power series), :mod:`.host`
(:class:`HostStats`: a server's workers sharing their statistics) and :mod:`.merge` (their
states merged into one at read).
"""

from __future__ import annotations

from .cell import Cell
from .contract import Statistics, StatsView
from .host import ENV, HostStats, clear_directory, multiproc_dir
from .labels import (
    GROUPS,
    METHOD_MIX,
    NONE,
    OTHER,
    OUTCOMES,
    STATUS_CLASSES,
    UNMATCHED,
    key_bound,
    status_class,
)
from .rolling import parse_window
from .sketch import ACCURACY, JOULE_BUCKETS, quantiles
from .snapshot import SCHEMA
from .stats import STATE_SCHEMA, EnergyStats

__all__ = [
    "ACCURACY",
    "ENV",
    "GROUPS",
    "JOULE_BUCKETS",
    "METHOD_MIX",
    "NONE",
    "OTHER",
    "OUTCOMES",
    "SCHEMA",
    "STATE_SCHEMA",
    "STATUS_CLASSES",
    "UNMATCHED",
    "Cell",
    "EnergyStats",
    "HostStats",
    "Statistics",
    "StatsView",
    "clear_directory",
    "key_bound",
    "multiproc_dir",
    "parse_window",
    "quantiles",
    "status_class",
]
