"""The ``/energy`` page: one HTML file, with uPlot (MIT, vendored beside its LICENSE) inline.

Nothing is fetched from elsewhere: the page carries the plotting library, its stylesheet
and the first snapshot, draws at once, then refreshes itself from ``/energy`` (JSON) while
it is open.
"""

from __future__ import annotations

import json
from functools import cache
from importlib.resources import files
from typing import Any


@cache
def _asset(name: str) -> str:
    return files(__package__).joinpath(name).read_text("utf-8")


def render_page(data: dict[str, Any], *, path: str, refresh_s: float = 5.0) -> bytes:
    """The page with ``data`` (an ``/energy`` snapshot) as its first figures."""
    boot = json.dumps({"path": path, "refresh_s": refresh_s, "data": data}, separators=(",", ":"))
    boot = boot.replace("</", "<\\/")  # a route label can never close the script
    html = _asset("energy.html")
    for key, value in (
        ("/*UPLOT_CSS*/", _asset("uPlot.min.css")),
        ("/*UPLOT_JS*/", _asset("uPlot.iife.min.js").replace("</script", "<\\/script")),
        ("/*BOOT*/null", boot),
    ):
        html = html.replace(key, value)
    return html.encode("utf-8")


__all__ = ["render_page"]
