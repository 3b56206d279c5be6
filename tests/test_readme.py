"""Every README and docs/ snippet marked runnable runs, as extracted (never copied here).

The convention (docs/demo.md says it for writers): a fenced block whose info string has the
word ``run`` after its language is run by this test, as written.

- ```` ```bash run ````  runs with ``bash -eo pipefail`` in the repository root, the venv's
  ``bin`` first on ``PATH``, ``GIUL_DEMO_PORT=0`` and ``GIUL_DEMO_UPSTREAM_PORT=0`` (so a
  ``giul-asgi demo --load N`` in it takes free ports); it must exit 0.
- ```` ```python run ```` runs as a script with this interpreter in the repository root
  (``examples`` importable); it must exit 0.
- ```` ```bash run demo ```` / ```` ```python run demo ````: the same, while one demo (started
  here with ``giul-asgi demo --serve`` on free ports) serves; ``localhost:8000`` and
  ``127.0.0.1:8000`` in the block are replaced by the demo gateway's address,
  ``localhost:8001``/``127.0.0.1:8001`` by its upstream's.

Blocks without ``run`` (the set-up lines, which make a venv; excerpts) are not run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FENCE = re.compile(r"^```([A-Za-z0-9_+-]+)([^\n]*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
LANGUAGES = {"bash": "bash", "sh": "bash", "shell": "bash", "console": "bash", "python": "python",
             "py": "python"}


@dataclass(frozen=True)
class Snippet:
    line: int
    language: str
    demo: bool
    code: str
    file: str = "README.md"


def snippets(text: str, file: str = "README.md") -> list[Snippet]:
    found = []
    for match in FENCE.finditer(text):
        flags = match.group(2).split()
        if "run" not in flags:
            continue
        language = LANGUAGES.get(match.group(1).lower())
        line = text.count("\n", 0, match.start()) + 1
        if language is None:
            raise AssertionError(f"{file}:{line}: a runnable block must be bash or python, "
                                 f"not {match.group(1)!r}")
        found.append(Snippet(line, language, "demo" in flags, match.group(3), file))
    return found


DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]
SNIPPETS = [s for doc in DOCUMENTS if doc.exists()
            for s in snippets(doc.read_text(), str(doc.relative_to(ROOT)))]
README_SNIPPETS = [s for s in SNIPPETS if s.file == "README.md"]
#: The README's length the first hour can read (issue 21: the rest lives in docs/, linked).
MAX_README_LINES = 250


def test_the_convention_finds_marked_blocks_only() -> None:
    text = ("intro\n```bash\nnot me\n```\n```bash run\necho one\n```\n"
            "```python run demo\nprint(2)\n```\n```text run\nx\n```\n")
    with pytest.raises(AssertionError, match="bash or python"):
        snippets(text)
    found = snippets(text.rsplit("```text", 1)[0])
    assert [(s.line, s.language, s.demo, s.code) for s in found] == [
        (5, "bash", False, "echo one\n"), (8, "python", True, "print(2)\n")]


def test_the_readme_marks_runnable_snippets() -> None:
    assert README_SNIPPETS, "README.md marks no snippet runnable (```bash run / ```python run)"
    assert any(s.demo for s in README_SNIPPETS), "no README snippet runs against the demo (```bash run demo)"


def test_the_readme_opens_with_what_it_is_then_the_two_commands() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines (at most {MAX_README_LINES})"
    assert lines[0].startswith("# "), "the README opens with its title"
    fence = lines.index("```bash")
    assert fence < 10, "the two commands come right after what it is"
    commands = lines[fence + 1:lines.index("```", fence)]
    assert len(commands) == 2 and "giul-asgi demo" in commands[0] and "pytest" in commands[1]


def test_every_link_to_a_file_leads_to_one() -> None:
    link = re.compile(r"\]\(([^)#:]+)(?:#[^)]*)?\)")
    for doc in DOCUMENTS:
        for target in link.findall(doc.read_text()):
            assert (doc.parent / target).exists(), f"{doc.relative_to(ROOT)} links to missing {target}"


@pytest.fixture(scope="module")
def demo() -> Iterator[tuple[str, str]]:
    if not any(s.demo for s in SNIPPETS):
        pytest.fail("no demo snippet")
    sys.path.insert(0, str(Path(__file__).parent))
    from test_demo import Demo

    running = Demo("--serve")
    try:
        api = running.read_until("  API ").split()[1].removesuffix("/v1")
        upstream = running.read_until("  upstream ").split()[1].removesuffix("/v1")
        running.read_until("ready")
    except BaseException:
        running.stop(9)
        raise
    yield api, upstream
    assert running.stop() == 0


def environment() -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
            "PYTHONPATH": str(ROOT), "GIUL_DEMO_PORT": "0", "GIUL_DEMO_UPSTREAM_PORT": "0"}


def execute(snippet: Snippet, code: str) -> None:
    if snippet.language == "bash":
        argv = ["bash", "-eo", "pipefail", "-c", code]
    else:
        argv = [sys.executable, "-c", code]
    result = subprocess.run(argv, cwd=ROOT, env=environment(), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, (
        f"{snippet.file}:{snippet.line} exited {result.returncode}\n--- code ---\n{code}"
        f"\n--- stdout ---\n{result.stdout[-3000:]}\n--- stderr ---\n{result.stderr[-3000:]}")


@pytest.mark.parametrize("snippet", [s for s in SNIPPETS if not s.demo],
                         ids=lambda s: f"{s.file}:{s.line}")
def test_snippet_runs(snippet: Snippet) -> None:
    execute(snippet, snippet.code)


@pytest.mark.parametrize("snippet", [s for s in SNIPPETS if s.demo], ids=lambda s: f"{s.file}:{s.line}")
def test_snippet_runs_against_the_demo(snippet: Snippet, demo: tuple[str, str]) -> None:
    api, upstream = demo
    code = snippet.code
    for host in ("localhost", "127.0.0.1"):
        code = code.replace(f"http://{host}:8000", api).replace(f"http://{host}:8001", upstream)
        code = code.replace(f"{host}:8000", api.removeprefix("http://"))
        code = code.replace(f"{host}:8001", upstream.removeprefix("http://"))
    execute(snippet, code)
