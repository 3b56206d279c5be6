"""The README's settings table, made from the code's own field comments (``#:`` lines).

Each setting is documented once, where it is declared: the middleware's parameters in
``EnergyMiddleware.__init__``'s signature, its settings as :class:`Options` fields, and
:class:`Node`, :class:`Tier`, :class:`Route` and :class:`Budget` fields. This module reads those comments
(as Sphinx's autodoc does) and renders one markdown table per place a setting is given;
tests/test_settings_table.py keeps README.md's copy, between the ``settings`` markers, in
step, and ``GIUL_WRITE_DOCS=1`` writes it anew. A :class:`Budget`'s table (its fields are
given inside ``budgets=[...]``) is kept the same way in docs/configuration.md, Budgets.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
from collections.abc import Iterator
from typing import Any

from giul_asgi.asgi.middleware import EnergyMiddleware
from giul_asgi.asgi.options import Options
from giul_asgi.budgets import Budget
from giul_asgi.config import Node, Route, Tier

START = "<!-- settings: generated from the code's #: comments by tests/settings_table.py -->"
END = "<!-- /settings -->"
BUDGET_START = "<!-- settings: Budget, generated from the code's #: comments by tests/settings_table.py -->"


def _comments(lines: list[str], lineno: int) -> str:
    """The ``#:`` lines right above line ``lineno`` (1-based), joined."""
    found: list[str] = []
    index = lineno - 2
    while index >= 0 and lines[index].strip().startswith("#:"):
        found.insert(0, lines[index].strip()[2:].strip())
        index -= 1
    return " ".join(found)


def field_docs(cls: type) -> dict[str, str]:
    """Each field's ``#:`` comment in a dataclass's source."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    tree = ast.parse(source)
    body = tree.body[0]
    assert isinstance(body, ast.ClassDef)
    return {node.target.id: _comments(lines, node.lineno) for node in body.body
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}


def parameter_docs(function: Any) -> dict[str, str]:
    """Each parameter's ``#:`` comment in a function's signature."""
    source = textwrap.dedent(inspect.getsource(function))
    lines = source.splitlines()
    tree = ast.parse(source)
    definition = tree.body[0]
    assert isinstance(definition, ast.FunctionDef)
    arguments = [*definition.args.args, *definition.args.kwonlyargs]
    return {a.arg: _comments(lines, a.lineno) for a in arguments}


def _default(value: Any) -> str:
    if value is dataclasses.MISSING or value is inspect.Parameter.empty:
        return "required"
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1000:
        return f"`{value:g}`"
    return f"`{value!r}`" if value != () else "`()`"


def _dataclass_rows(cls: type) -> Iterator[tuple[str, str, str]]:
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        default: Any = f.default
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        yield f.name, _default(default), docs.get(f.name, "")


def _middleware_rows() -> Iterator[tuple[str, str, str]]:
    docs = parameter_docs(EnergyMiddleware.__init__)
    signature = inspect.signature(EnergyMiddleware.__init__)
    for name, parameter in signature.parameters.items():
        if name in ("self", "app") or parameter.kind is inspect.Parameter.VAR_KEYWORD:
            continue
        yield name, _default(parameter.default), docs.get(name, "")
    yield from _dataclass_rows(Options)


def _table(title: str, rows: Iterator[tuple[str, str, str]]) -> list[str]:
    out = [f"| {title} | default | what it does |", "|---|---|---|"]
    for name, default, doc in rows:
        text = re.sub(r"``([^`]+)``", r"`\1`", doc).replace("|", "\\|")  # reST to markdown
        out.append(f"| `{name}` | {default} | {text} |")
    return out


def render() -> str:
    """The settings section's body, between the markers."""
    lines = [START,
             *_table("`EnergyMiddleware(app, ...)`", _middleware_rows()), "",
             *_table("`Node(...)`, `[[node]]`", _dataclass_rows(Node)), "",
             *_table("`Tier(...)`, `[[tier]]`", _dataclass_rows(Tier)), "",
             *_table("`Route(...)`, `[[route]]`", _dataclass_rows(Route)),
             END]
    return "\n".join(lines)


def render_budget() -> str:
    """docs/configuration.md's table of a Budget's fields (given inside ``budgets=[...]``:
    the README's table points there), between its own markers."""
    return "\n".join([BUDGET_START, *_table("`Budget(...)`", _dataclass_rows(Budget)), END])


def missing_docs() -> list[str]:
    """Settings declared without a ``#:`` comment."""
    rows = [("EnergyMiddleware", r) for r in _middleware_rows()]
    rows += [(cls.__name__, r) for cls in (Node, Tier, Route, Budget) for r in _dataclass_rows(cls)]
    return [f"{owner}.{name}" for owner, (name, _, doc) in rows if not doc]
