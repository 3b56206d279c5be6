"""The process's ``GIUL_ASGI_*`` variables: which there are, and one check of them all at startup.

Two variables change a default for every middleware of the process: ``GIUL_ASGI_LOAD_DIR``
(where the host's processes share, :mod:`giul_asgi.hostshare.place`) and
``GIUL_ASGI_SWITCH_INTERVAL`` (the GIL's switch interval while readers run,
:mod:`giul_asgi.switch`). Each module checks its own value; this one checks the names:
a ``GIUL_ASGI_`` variable that is neither (``GIUL_ASGI_LOADDIR=off``) is a setting that would
silently do nothing, so it stops the startup too, with the name it nearly is.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping

from .errors import ConfigError
from .hostshare.place import ENV as LOAD_DIR
from .hostshare.place import check_environment as check_load_dir
from .switch import ENV as SWITCH_INTERVAL
from .switch import check_environment as check_switch_interval

PREFIX = "GIUL_ASGI_"
#: Every variable the package reads.
VARIABLES = (LOAD_DIR, SWITCH_INTERVAL)


def check_environment(env: Mapping[str, str] = os.environ) -> None:
    """Raise :class:`ConfigError` for a ``GIUL_ASGI_*`` name the package does not read, or a
    value one of its variables cannot take."""
    for name in sorted(env):
        if name.startswith(PREFIX) and name not in VARIABLES:
            # Matched without the prefix every name shares (GIUL_ASGI_TRACE is not LOAD_DIR).
            close = difflib.get_close_matches(name[len(PREFIX):], [v[len(PREFIX):] for v in VARIABLES],
                                              n=1, cutoff=0.6)
            meant = f"did you mean {PREFIX}{close[0]}? " if close else ""
            raise ConfigError(f"{name} is not a giul-asgi variable (they are {', '.join(VARIABLES)})",
                              remedy=f"{meant}rename or unset it")
    check_load_dir(env)
    check_switch_interval(env)


__all__ = ["PREFIX", "VARIABLES", "check_environment"]
