"""Starlette's own test suite as a gate: nothing that passes bare may fail behind EnergyMiddleware.

Why: the middleware sits in front of every answer a gateway gives, so it must never change what
an app sends. Starlette's suite is the widest set of legal ASGI behaviours at hand (streams,
trailers, files, websockets, lifespans, middleware stacks; not pathsend, which its TestClient does
not offer: those tests call apps directly and stay unwrapped). This script downloads the
sdist of the *installed* Starlette with pip, runs its response, middleware, routing, static-file,
websocket, application and test-client tests twice from the sdist's own root (its own conftest and
pytest config: warnings are errors, asyncio and trio), once bare and once with every app its
TestClient builds wrapped in ``EnergyMiddleware(app, inject_json=False)`` (the plugin beside this
file), and exits 1 listing every test that passes bare and fails or errors wrapped. Tests that fail
bare are reported and ignored. A test that fails wrapped is run again alone, bare and wrapped, so a
load hiccup on a busy machine does not fail the gate; a hang fails one test (pytest-timeout).

    .venv/bin/python .ci/starlette_suite.py [--workdir DIR] [--nodes default|none] [-k EXPR]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
PLUGIN = "giul_starlette_plugin"
#: Starlette's tests for what a middleware in front of an app can change, by file.
TEST_PATHS = (
    "tests/test_responses.py",
    "tests/middleware",
    "tests/test_routing.py",
    "tests/test_staticfiles.py",
    "tests/test_websockets.py",
    "tests/test_applications.py",
    "tests/test_testclient.py",
)
#: What those tests import beyond Starlette itself (module -> pip requirement); the test extra of
#: pyproject.toml lists them too, this is the fallback for a venv built without it.
NEEDS = {
    "httpx2": "httpx2[zstd]",
    "python_multipart": "python-multipart",
    "itsdangerous": "itsdangerous",
    "opentelemetry.sdk": "opentelemetry-sdk",
    "trio": "trio",
    "pytest_timeout": "pytest-timeout",
}
if sys.version_info < (3, 14):  # zstd decoding, which test_websocket_headers expects the client to offer
    NEEDS["backports.zstd"] = "httpx2[zstd]"
PER_TEST_TIMEOUT_S = 20  # a deadlocked test fails alone; the slowest bare test takes well under 1 s
RUN_TIMEOUT_S = 1200  # the whole run, in case a hang escapes pytest-timeout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the sdist goes (default: a temp dir, removed after)")
    parser.add_argument("--nodes", choices=("default", "none"), default="default",
                        help="the wrapped middleware's nodes: its default local node, or one with no reader")
    parser.add_argument("-k", dest="keyword", default=None,
                        help="only tests matching this pytest -k expression")
    args = parser.parse_args()

    version = importlib.metadata.version("starlette")
    install_missing()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="giul-starlette-"))
    try:
        root = fetch_suite(version, workdir)
        select = ["-k", args.keyword] if args.keyword else []
        verdict = gate(root, [*TEST_PATHS, *select], nodes=args.nodes)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"Starlette {version}: {verdict.collected} tests collected, {verdict.wraps} apps wrapped, "
          f"{verdict.seconds:.0f} s in all")
    print(verdict.report())
    return 0 if verdict.ok else 1


@dataclass
class Verdict:
    """What the gate found: which tests pass bare, which of those fail wrapped, and why."""

    collected: int
    wraps: int
    passed_bare: list[str]
    failing_bare: dict[str, str]  # test -> why, ignored
    broken: dict[str, str]  # passes bare, fails wrapped: test -> why
    flaky: list[str]  # failed wrapped once, passed when run again
    seconds: float

    @property
    def ok(self) -> bool:
        return self.wraps > 0 and not self.broken

    def report(self) -> str:
        lines = [f"  fails bare (ignored): {t}: {why}" for t, why in self.failing_bare.items()]
        lines += [f"  PASSES BARE, FAILS WRAPPED: {t}: {why}" for t, why in self.broken.items()]
        lines += [f"  failed wrapped once, passed when run again (not counted): {t}" for t in self.flaky]
        if self.wraps == 0:
            lines.append("  the wrapped run wrapped no TestClient app: the plugin did not load")
        lines.append(f"starlette suite: {len(self.passed_bare)} passed bare, "
                     f"{len(self.broken)} of them fail wrapped")
        return "\n".join(lines)


def gate(root: Path, selection: list[str], *, nodes: str = "default") -> Verdict:
    """Run ``selection`` bare and wrapped from ``root``; confirm what fails only wrapped."""
    started = time.monotonic()
    bare = run_suite(root, selection, wrap=False, nodes=nodes, tag="bare")
    wrapped = run_suite(root, selection, wrap=True, nodes=nodes, tag="wrapped")
    passed_bare = sorted(t for t, o in bare.tests.items() if o.passed)
    suspects = [t for t in passed_bare if t not in wrapped.tests or wrapped.tests[t].failed]
    broken = confirm(root, suspects, wrapped, nodes) if suspects else {}
    return Verdict(
        collected=len(bare.tests), wraps=wrapped.wraps, passed_bare=passed_bare,
        failing_bare={t: o.message for t, o in sorted(bare.tests.items()) if o.failed},
        broken=broken, flaky=[t for t in suspects if t not in broken],
        seconds=time.monotonic() - started,
    )


class Outcome:
    """How one test went across its phases (setup, call, teardown)."""

    def __init__(self) -> None:
        self.failed = False
        self.skipped = False
        self.called = False
        self.message = ""

    def add(self, line: dict[str, object]) -> None:
        if line["outcome"] == "failed":
            if not self.failed:
                self.message = f"[{line['when']}] {line.get('message', '')}"
            self.failed = True
        elif line["outcome"] == "skipped":
            self.skipped = True
        elif line["when"] == "call":
            self.called = True

    @property
    def passed(self) -> bool:
        return self.called and not self.failed and not self.skipped


class Run:
    """The outcomes of one pytest run, read from the plugin's JSON lines."""

    def __init__(self, path: Path, returncode: int | None) -> None:
        self.tests: dict[str, Outcome] = {}
        self.wraps = 0
        for text in path.read_text(encoding="utf-8").splitlines() if path.exists() else ():
            line = json.loads(text)
            if "wraps" in line:
                self.wraps = int(line["wraps"])
            else:
                self.tests.setdefault(str(line["id"]), Outcome()).add(line)
        self.returncode = returncode


def install_missing() -> None:
    """pip-install what the chosen tests import and this venv lacks (normally nothing)."""
    missing = [req for module, req in NEEDS.items() if not _has(module)]
    if missing:
        print(f"installing what Starlette's tests need: {' '.join(missing)}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *missing], check=True)


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def fetch_suite(version: str, workdir: Path) -> Path:
    """Download and unpack Starlette's sdist; return its root (tests/ and pyproject.toml)."""
    root = workdir / f"starlette-{version}"
    if (root / "tests").is_dir():
        return root
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
         f"starlette=={version}", "-d", str(workdir)],
        check=True,
    )
    (sdist,) = workdir.glob(f"starlette-{version}.tar.gz")
    with tarfile.open(sdist) as tar:
        if hasattr(tarfile, "data_filter"):  # Python 3.11.4 and later
            tar.extractall(workdir, filter="data")
        else:  # pragma: no cover - the sdist comes from PyPI by its exact name
            tar.extractall(workdir)
    # The installed Starlette is the one under test: the sdist's copy must not shadow it.
    shutil.rmtree(root / "starlette")
    return root


def run_suite(root: Path, selection: list[str], *, wrap: bool, nodes: str, tag: str) -> Run:
    """One pytest run of ``selection`` from the sdist's root, with its own config and conftest."""
    outcomes = root / f".giul-{tag}.jsonl"
    command = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-p", PLUGIN,
        f"--giul-outcomes={outcomes}", f"--timeout={PER_TEST_TIMEOUT_S}", *selection,
    ]
    if wrap:
        command += ["--giul-wrap", f"--giul-nodes={nodes}"]
    path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    print(f"starlette suite, {tag}: {' '.join(command[1:])}", flush=True)
    try:
        done = subprocess.run(command, cwd=root, env=env, timeout=RUN_TIMEOUT_S,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        returncode: int | None = done.returncode
        tail = done.stdout.strip().splitlines()[-1:] if done.stdout else []
    except subprocess.TimeoutExpired:
        returncode, tail = None, [f"killed after {RUN_TIMEOUT_S} s"]
    print(f"starlette suite, {tag}: {' '.join(tail)}", flush=True)
    if returncode not in (0, 1) and returncode is not None:  # 2-5: pytest itself could not run
        raise SystemExit(f"starlette suite: the {tag} run could not start (pytest exit {returncode}):\n"
                         f"{done.stdout[-4000:]}")
    return Run(outcomes, returncode)


def confirm(root: Path, suspects: list[str], wrapped: Run, nodes: str) -> dict[str, str]:
    """Rerun each suspect alone, bare then wrapped; keep those that pass bare and fail wrapped."""
    bare_again = run_suite(root, suspects, wrap=False, nodes=nodes, tag="bare-again")
    wrapped_again = run_suite(root, suspects, wrap=True, nodes=nodes, tag="wrapped-again")
    broken: dict[str, str] = {}
    for test in suspects:
        again = wrapped_again.tests.get(test)
        if not bare_again.tests.get(test, Outcome()).passed:
            continue  # flaky bare: not ours to judge
        if again is None or again.failed:
            first = wrapped.tests.get(test)
            broken[test] = (first.message if first is not None and first.message
                            else again.message if again is not None else "did not run (the run was killed)")
    return broken


if __name__ == "__main__":
    sys.exit(main())
