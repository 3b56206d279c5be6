"""The overhead benchmark compares like with like: every stack serves the same answers.

Peers that need the bench extra (starlette-exporter, OpenTelemetry) are skipped when it is
not installed; the rest run here, so a benchmark row never times a broken stack.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from asgi_lifespan import LifespanManager

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
from _apps import PATHS, PAYLOAD, VARIANTS, build

pytestmark = pytest.mark.anyio

NEEDS = {
    "starlette-exporter": "starlette_exporter", "opentelemetry": "opentelemetry.instrumentation.asgi",
    "prometheus-fastapi-instrumentator": "prometheus_fastapi_instrumentator",
}
ENERGY_HEADERS = {
    "x-energy-joules", "x-energy-method", "x-energy-backend", "x-energy-source",
    "x-energy-node", "x-energy-tier", "x-energy-seconds", "x-energy-tokens",
    "x-energy-joules-per-token", "x-energy-uncertainty", "x-energy-settled",
}


@pytest.fixture(autouse=True)
def _no_fake_pynvml_left() -> Iterator[None]:
    """The giul-asgi-nvml stack installs benchmarks/fake_pynvml as ``pynvml``: take it out
    after each test, or every later test that asks NVML would find a fake card."""
    yield
    import fake_pynvml

    fake_pynvml.uninstall()


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


@pytest.mark.parametrize("variant", VARIANTS)
async def test_every_stack_serves_the_same_answers(variant: str) -> None:
    if variant in NEEDS and not _installed(NEEDS[variant]):
        pytest.skip(f"{variant} needs the bench extra")
    # Started and shut down as a server would: without its lifespan the app's reader and row
    # writer outlived the test, and a later test that fakes the GIL's switch saw them hurry it.
    async with LifespanManager(build(variant)) as served, \
            httpx.AsyncClient(transport=httpx.ASGITransport(app=served.app), base_url="http://b") as c:
        answer = await c.get("/v1/chat/completions")
        stream = await c.get("/v1/stream/8")
        usage_stream = await c.get("/v1/stream-usage/8")
        after = await c.get(PATHS["json-after"].replace("{n}", "1500"))  # an upstream's 1.5 ms
    assert answer.status_code == 200 and stream.status_code == 200
    body = answer.json()
    energy = body.pop("energy", None)
    assert body == json.loads(json.dumps(PAYLOAD))
    assert int(answer.headers["content-length"]) == len(answer.content)
    waited = after.json()
    assert (waited.pop("energy", None) is None) is (energy is None) and waited == body
    assert stream.text.count("data: ") >= 9 and "data: [DONE]" in stream.text

    blocks = ("floor", "giul-asgi", "giul-asgi-nvml", "giul-asgi-nvml-workers", "giul-asgi-nvml-unshared")
    writes_energy = variant in (*blocks, "giul-asgi-headers")
    assert (set(answer.headers) >= ENERGY_HEADERS) is writes_energy
    assert (energy is not None) is (variant in blocks)
    if energy is not None:
        assert energy["tokens"] == PAYLOAD["usage"]["completion_tokens"]  # type: ignore[index]
        assert answer.headers["x-energy-tokens"] == "48"

    # The include_usage stream: its usage chunk, and in ours the energy riding in it.
    events = [e for e in usage_stream.text.split("\n\n") if e.startswith("data: {")]
    assert len(events) == 10 and all('"usage":null' in e for e in events[:9])
    last = json.loads(events[-1][len("data: "):])
    assert last["usage"] == PAYLOAD["usage"]
    assert ("energy" in last) is variant.startswith("giul-asgi")
    if "energy" in last:
        assert last["energy"]["tokens"] == 48


async def test_server_path_drives_uvicorns_own_protocol() -> None:
    """server_path.py times what uvicorn writes: whole responses, our headers among them."""
    pytest.importorskip("httptools")
    from server_path import Server, headers_app

    wire = await Server(build("giul-asgi")).answer("/v1/chat/completions")
    head, _, body = wire.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 200 OK"
    names = {line.split(b":", 1)[0].decode() for line in lines[1:]}
    assert names >= ENERGY_HEADERS
    length = next(int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length"))
    assert length == len(body) and json.loads(body)["energy"]["tokens"] == 48

    plain = await Server(headers_app(11)).answer("/")
    assert plain.count(b"\r\nx-energy-") == 11
    assert await Server(headers_app(0)).per_request_us("/", 3) > 0


def test_fake_pynvml_is_what_the_nvml_reader_imports() -> None:
    """benchmarks/fake_pynvml stands in for nvidia-ml-py: Node(reader="nvml") builds its
    reader over it, every read is a call into its driver, and the counter is whole mJ that
    move only when the truth card's register steps."""
    import fake_pynvml
    from truecard import TrueCard

    from giul_asgi.readers.base import ReaderSpec
    from giul_asgi.readers.registry import READERS

    card = TrueCard(idle_w=70.0, period=0.1)
    driver = fake_pynvml.install([fake_pynvml.Gpu(card, processes=[4242])])
    try:
        import pynvml

        assert pynvml is fake_pynvml
        reader = READERS["nvml"](ReaderSpec(gpus=(0,)))
        assert reader.kind == "counter" and reader.backend == "nvml_counter"
        assert reader.probes[0].uuid is not None and reader.probes[0].uuid.startswith("GPU-fake-")
        counted = driver.calls().get("counter", 0)
        readings = [reader.read() for _ in range(5)]
        assert driver.calls()["counter"] == counted + 5
        assert len(driver.stats.lags_ns) >= 5 and driver.stats.threads
        for r in readings:
            assert r.ok and r.joules is not None
            assert r.joules * 1000 == pytest.approx(round(r.joules * 1000))  # whole mJ
        # The register holds its value between steps: what it says is the card's energy at
        # its last step, floored to the mJ (the step before the read or one during it).
        before = card.last_step(card.clock())
        joules = reader.read().joules
        after = card.last_step(card.clock())
        assert joules is not None
        assert round(joules * 1000) in {max(0, math.floor(card.energy(s) * 1000)) for s in (before, after)}
        assert [p.pid for p in (reader.processes() or [])] == [4242]
        reader._handles[0].fail = fake_pynvml.NVML_ERROR_GPU_IS_LOST  # a driver that fails
        failed = reader.read()
        assert not failed.ok and "GPU is lost" in (failed.error or "")
        reader.close()
    finally:
        fake_pynvml.uninstall()
    assert "pynvml" not in sys.modules or sys.modules["pynvml"] is not fake_pynvml


def test_fake_pynvml_power_gauges() -> None:
    """Without the counter the reader falls back to the instant field, as on a real card."""
    import fake_pynvml

    from giul_asgi.readers.base import ReaderSpec
    from giul_asgi.readers.nvml import NvmlReader

    fake_pynvml.install([fake_pynvml.Gpu(fake_pynvml.busy_card(watts=100.0), counter=False)])
    try:
        reader = NvmlReader(ReaderSpec(gpus=(0,)))
        assert reader.kind == "power"
        reading = reader.read()
        assert reading.ok and reading.watts is not None and 60.0 < reading.watts < 200.0
        reader.close()
    finally:
        fake_pynvml.uninstall()


async def test_attribution_runs_a_saturated_loop_on_the_nvml_path() -> None:
    """The accuracy matrix's saturated scenario runs on the production path: the ledger's own
    reader thread over fake_pynvml, the loop busy beside the windows, truth from the card."""
    from attribution import Request, Scenario, run

    scenario = Scenario("saturated, tiny", [Request(0.0, 0.03, 180.0), Request(0.1, 0.03, 180.0)],
                        saturate=True)
    row = await run(scenario, seed=1, path="nvml")
    assert len(row.outcomes) == 2 and all(o.truth > 0 for o in row.outcomes)
    # How many readings a starved reader got is what the benchmark measures, not a promise:
    # the row only has to carry it.
    assert row.reads >= 0 and row.wall_s > 0
    cells = row.cells()
    assert {"with figure", "charged/caused", "unc/J first", "reads/period"} <= set(cells)


async def test_overhead_handoffs_measure_the_nvml_reader() -> None:
    """overhead.py's breakdown rows exist on the NVML path: reads, driver calls, GIL lags."""
    from overhead import PATHS as OVERHEAD_PATHS
    from overhead import handoffs, run_requests

    app = build("giul-asgi-nvml")
    await run_requests(app, OVERHEAD_PATHS["json"], 20)
    rows = dict((what, value) for what, value, _how in
                await handoffs(app, OVERHEAD_PATHS["json"], 200, nvml=True))
    assert {"readings the ledger took", "counter reads during the requests", "driver calls, a request",
            "GIL back after a driver call, us", "reader thread CPU, us a request"} <= set(rows)
