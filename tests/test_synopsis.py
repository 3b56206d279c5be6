"""Every CLI synopsis says what the parsers take (issue 21 item 7).

The probe's synopsis in the README lacked ``--no-local``, ``--gpus``, ``--sample`` and
``--agent-token-file`` while every remedy says ``giul-asgi probe --no-local --agent ...``.
Two checks, both from the argparse parsers themselves (``giul_asgi.cli.build_parser``):

- docs/cli.md is generated from them: each command's synopsis and options, with their
  help. This test fails when it is out of step; ``GIUL_WRITE_DOCS=1 python -m pytest
  tests/test_synopsis.py`` writes it anew.
- every mention of ``giul-asgi <command> --option`` in README.md, docs/ and the package
  (docstrings, remedies, help) names an option that command has; a bracketed synopsis
  (``giul-asgi probe [--json] ...``) lists every option it has, unless it says ``...``.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import pytest

from giul_asgi.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
CLI_DOC = ROOT / "docs" / "cli.md"
PROG = "giul-asgi"


def _subparsers() -> argparse._SubParsersAction:  # type: ignore[type-arg]
    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def commands() -> dict[str, argparse.ArgumentParser]:
    return dict(_subparsers().choices)


def summaries() -> dict[str, str]:
    """Each command's one-line help, as ``giul-asgi --help`` lists it."""
    return {a.dest: a.help or "" for a in _subparsers()._choices_actions}


def _arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]


def options_of(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in _arguments(parser) for o in a.option_strings}


def _shape(action: argparse.Action) -> str:
    """``--idle SECONDS``, ``--split {time,tokens}``, ``--json``, ``TRACE``."""
    if action.choices is not None and not action.metavar:
        value = "{" + ",".join(str(c) for c in action.choices) + "}"
    else:
        value = str(action.metavar or action.dest.upper())
    if not action.option_strings:
        return value
    takes = action.nargs != 0  # store_true/store_false/count take nothing
    return f"{action.option_strings[-1]} {value}" if takes else action.option_strings[-1]


def synopsis(name: str, parser: argparse.ArgumentParser) -> str:
    parts = [f"{PROG} {name}"]
    for action in _arguments(parser):
        shape = _shape(action)
        parts.append(shape if not action.option_strings or action.required else f"[{shape}]")
    return " ".join(parts)


def cli_markdown() -> str:
    """docs/cli.md, from the parsers."""
    out = [
        "# The command line",
        "",
        "Generated from the argparse parsers (`giul_asgi/cli.py`); `tests/test_synopsis.py` keeps",
        "it in step (`GIUL_WRITE_DOCS=1 python -m pytest tests/test_synopsis.py` writes it anew).",
        "Exit status: 0 done, 2 bad usage or configuration, 1 a runtime failure.",
        "",
        "```text",
        f"{PROG} [--version] {{{','.join(commands())}}} ...",
        "```",
    ]
    for name, parser in commands().items():
        out += ["", f"## {PROG} {name}", ""]
        about = parser.description or summaries().get(name)
        if about:
            out += [about[0].upper() + about[1:] + ("" if about.endswith(".") else "."), ""]
        out += ["```text", synopsis(name, parser), "```", "", "| argument | what it does |",
                "|---|---|"]
        for action in _arguments(parser):
            text = (action.help or "").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
            out.append(f"| `{_shape(action)}` | {text} |")
    return "\n".join(out) + "\n"


def test_docs_cli_md_is_generated_from_the_parsers() -> None:
    want = cli_markdown()
    if os.environ.get("GIUL_WRITE_DOCS"):
        CLI_DOC.write_text(want)
    assert CLI_DOC.exists() and CLI_DOC.read_text() == want, (
        "docs/cli.md is out of step with the parsers: GIUL_WRITE_DOCS=1 python -m pytest "
        "tests/test_synopsis.py rewrites it")
    for name, parser in commands().items():  # every option is in it: the test can fail
        for option in options_of(parser):
            assert f"`{option}" in want, (name, option)


# -- every mention, wherever it is ---------------------------------------------------------------

MENTION = re.compile(rf"{PROG} (demo|probe|agent|replay)\b([^`\n'\"()]*)")
OPTION = re.compile(r"--[a-z][a-z0-9-]*")
FENCE = re.compile(r"```.*?```", re.DOTALL)
SPAN = re.compile(r"`[^`]+`")


def _joined_spans(text: str) -> str:
    """Markdown with each inline code span on one line (a synopsis may wrap), fences kept."""
    fences: list[str] = []

    def keep(match: re.Match[str]) -> str:
        fences.append(match.group(0))
        return f"\0{len(fences) - 1}\0"

    text = FENCE.sub(keep, text)
    text = SPAN.sub(lambda m: m.group(0).replace("\n", " "), text)
    return re.sub(r"\0(\d+)\0", lambda m: fences[int(m.group(1))], text)


def sources() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    found += sorted((ROOT / "giul_asgi").rglob("*.py"))
    found += sorted((ROOT / "examples").glob("*.py"))
    return [p for p in found if p.exists() and p != CLI_DOC]


def mentions() -> list[tuple[str, int, str, str]]:
    """(file, line, command, the rest of the mention) for every mention in the sources."""
    out = []
    for path in sources():
        text = path.read_text()
        if path.suffix == ".md":
            text = _joined_spans(text)
        for match in MENTION.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            out.append((str(path.relative_to(ROOT)), line, match.group(1), match.group(2)))
    return out


MENTIONS = mentions()


def test_mentions_are_found() -> None:
    assert len(MENTIONS) > 20
    assert any(cmd == "probe" and "--no-local" in rest for _, _, cmd, rest in MENTIONS)  # a remedy


@pytest.mark.parametrize(("where", "line", "command", "rest"), MENTIONS,
                         ids=[f"{w}:{n}" for w, n, _, _ in MENTIONS])
def test_every_mentioned_option_exists(where: str, line: int, command: str, rest: str) -> None:
    parser = commands()[command]
    known = options_of(parser) | {"--help"}
    unknown = sorted(set(OPTION.findall(rest)) - known)
    assert not unknown, f"{where}:{line}: giul-asgi {command} has no {', '.join(unknown)}"
    if "[--" in rest and "..." not in rest:
        missing = sorted(options_of(parser) - set(OPTION.findall(rest)))
        assert not missing, (f"{where}:{line}: the synopsis of giul-asgi {command} lacks "
                             f"{', '.join(missing)}: {synopsis(command, parser)}")
