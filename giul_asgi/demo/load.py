"""Mixed load against an OpenAI-compatible gateway, and the table of what it cost.

``giul-asgi demo --load N`` sends N requests (chat and text completions, streamed and not,
with and without ``include_usage``, embeddings where a model's name says ``embed``) over
several models at once, keeping ``concurrency`` in flight, then fetches each answer's
settled record from ``/energy/requests/{id}`` and prints joules per request and per token
by route and tier, with how each figure was obtained (the method mix).

It speaks plain HTTP with httpx (no openai client needed) and reads the energy where a
client would find it: the ``X-Energy-*`` headers, the JSON ``"energy"`` block, or the
stream's chunk that carries ``"energy"``.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

PROMPTS = (
    "Explain why a GPU draws more power with a larger batch.",
    "Write a haiku about joules.",
    "Summarise the idea of continuous batching in two sentences.",
    "What is the idle power of a graphics card, and why does it matter for billing?",
    "List three ways to make inference cheaper.",
    "Translate 'energy per token' into French.",
    "Why does prefill cost more per token than decode on long prompts?",
    "Tell me a short story about a counter that steps every hundred milliseconds.",
)
MAX_TOKENS = (16, 32, 64, 128)


@dataclass(slots=True)
class Outcome:
    """One request of the load: what was sent, and the energy the gateway said it cost."""

    route: str
    model: str
    streamed: bool
    status: int | None = None
    id: str | None = None
    energy: dict[str, Any] | None = None
    settled: dict[str, Any] | None = None
    error: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def record(self) -> dict[str, Any] | None:
        """The settled record where the gateway kept one, else the first figure."""
        return self.settled or self.energy


@dataclass(frozen=True, slots=True)
class Plan:
    """The mix of one load run."""

    requests: int
    concurrency: int = 16
    seed: int = 0
    stream_share: float = 0.5
    embed_share: float = 0.15
    completion_share: float = 0.25


async def run_load(
    api: str,
    plan: Plan,
    *,
    models: Sequence[str] | None = None,
    progress: Callable[[], None] | None = None,
    client: httpx.AsyncClient | None = None,
) -> list[Outcome]:
    """Send ``plan.requests`` requests to the gateway at ``api`` (``http://host:port``)."""
    owned = client is None
    http = client or httpx.AsyncClient(base_url=api, timeout=httpx.Timeout(120.0, connect=5.0))
    try:
        names = list(models) if models is not None else await list_models(http)
        if not names:
            raise RuntimeError(f"{api}/v1/models lists no model to send load to")
        embed = [m for m in names if "embed" in m]
        generate = [m for m in names if "embed" not in m]
        rng = random.Random(plan.seed)
        jobs = [_pick(rng, plan, generate, embed) for _ in range(plan.requests)]
        gate = asyncio.Semaphore(plan.concurrency)

        async def one(job: tuple[str, str, bool, dict[str, Any]]) -> Outcome:
            async with gate:
                outcome = await _send(http, *job)
            if progress is not None:
                progress()
            return outcome

        outcomes = await asyncio.gather(*(one(job) for job in jobs))
        await settle(http, outcomes, concurrency=plan.concurrency)
        return list(outcomes)
    finally:
        if owned:
            await http.aclose()


async def list_models(http: httpx.AsyncClient) -> list[str]:
    r = await http.get("/v1/models")
    r.raise_for_status()
    return [str(e["id"]) for e in r.json().get("data", []) if isinstance(e, Mapping) and "id" in e]


def _pick(rng: random.Random, plan: Plan, generate: list[str],
          embed: list[str]) -> tuple[str, str, bool, dict[str, Any]]:
    prompt = f"{rng.choice(PROMPTS)} (request {rng.randrange(10**6)})"
    roll = rng.random()
    if embed and (roll < plan.embed_share or not generate):
        model = rng.choice(embed)
        return "/v1/embeddings", model, False, {"model": model, "input": prompt}
    model = rng.choice(generate)
    streamed = rng.random() < plan.stream_share
    body: dict[str, Any] = {"model": model, "max_tokens": rng.choice(MAX_TOKENS)}
    if streamed:
        body["stream"] = True
        if rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
    if roll < plan.embed_share + plan.completion_share:
        body["prompt"] = prompt
        return "/v1/completions", model, streamed, body
    body["messages"] = [{"role": "user", "content": prompt}]
    return "/v1/chat/completions", model, streamed, body


async def _send(http: httpx.AsyncClient, route: str, model: str, streamed: bool,
                body: dict[str, Any]) -> Outcome:
    outcome = Outcome(route=route, model=model, streamed=streamed)
    try:
        async with http.stream("POST", route, json=body) as r:
            outcome.status = r.status_code
            outcome.headers = {k.lower(): v for k, v in r.headers.items() if k.lower().startswith("x-energy")}
            outcome.id = r.headers.get("x-energy-id")
            if r.status_code >= 400:
                outcome.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
            elif streamed:
                async for line in r.aiter_lines():
                    _read_event_line(line, outcome)
            else:
                answer = json.loads(await r.aread())
                if isinstance(answer, Mapping) and isinstance(answer.get("energy"), dict):
                    outcome.energy = answer["energy"]
    except (httpx.HTTPError, ValueError) as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
    if outcome.energy is None and outcome.headers:
        outcome.energy = _from_headers(outcome.headers)
    return outcome


def _read_event_line(line: str, outcome: Outcome) -> None:
    if not line.startswith("data:"):
        return
    data = line[5:].strip()
    if not data or data == "[DONE]":
        return
    try:
        obj = json.loads(data)
    except ValueError:
        return
    if isinstance(obj, Mapping):
        if isinstance(obj.get("energy"), dict):
            outcome.energy = obj["energy"]
        if isinstance(obj.get("error"), Mapping):
            outcome.error = str(obj["error"].get("message"))


def _from_headers(headers: Mapping[str, str]) -> dict[str, Any]:
    def number(name: str) -> float | None:
        try:
            return float(headers[name])
        except (KeyError, ValueError):
            return None

    tokens = number("x-energy-tokens")
    return {"joules": number("x-energy-joules"), "method": headers.get("x-energy-method"),
            "node": headers.get("x-energy-node"), "tier": headers.get("x-energy-tier"),
            "tokens": int(tokens) if tokens is not None else None, "id": headers.get("x-energy-id")}


async def settle(http: httpx.AsyncClient, outcomes: Iterable[Outcome], *, concurrency: int = 16,
                 timeout: float = 3.0) -> None:
    """Fetch each answer's settled record (``/energy/requests/{id}``) where the gateway keeps one.

    A record that has not settled yet (the card had not reported the end of its window) is
    asked again a little later, until ``timeout``; after that the latest one is kept as it is.
    """
    gate = asyncio.Semaphore(concurrency)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout

    async def fetch(outcome: Outcome) -> dict[str, Any] | None:
        async with gate:
            try:
                r = await http.get(f"/energy/requests/{outcome.id}")
                body = r.json() if r.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                return None
        record = body.get("record", body) if isinstance(body, Mapping) else None
        return record if isinstance(record, dict) and "joules" in record else None

    async def one(outcome: Outcome) -> None:
        if outcome.id is None:
            return
        while True:
            record = await fetch(outcome)
            if record is not None:
                outcome.settled = record
            if (record is not None and record.get("settled")) or loop.time() > deadline:
                return
            await asyncio.sleep(0.2)

    await asyncio.gather(*(one(o) for o in outcomes))


# -- the table --------------------------------------------------------------------------------
def figure(value: float | None, unit: str = "") -> str:
    """A figure rounded to what it can tell: three significant digits; unknown says so."""
    if value is None:
        return "unknown"
    text = f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if "e" in text:
        text = f"{value:.2e}"
    return f"{text}{unit}"


def summarise(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    """One row per (route, tier): requests, tokens, joules per request and per token, methods."""
    groups: dict[tuple[str, str], list[Outcome]] = {}
    for o in outcomes:
        tier = str((o.record or {}).get("tier") or "?")
        groups.setdefault((o.route, tier), []).append(o)
    rows = []
    for (route, tier), group in sorted(groups.items()):
        records = [o.record for o in group if o.record is not None]
        known = [r for r in records if isinstance(r.get("joules"), int | float)]
        joules = sum(float(r["joules"]) for r in known)
        with_tokens = [r for r in known if isinstance(r.get("tokens"), int) and r["tokens"] > 0]
        tokens = sum(int(r["tokens"]) for r in with_tokens)
        token_joules = sum(float(r["joules"]) for r in with_tokens)
        methods = Counter(str(r.get("method")) for r in records)
        methods.update("failed" for o in group if o.error is not None)
        rows.append({
            "route": route, "tier": tier, "requests": len(group),
            "streamed": sum(o.streamed for o in group),
            "tokens": tokens if with_tokens else None,
            "joules": joules if known else None,
            "j_per_request": joules / len(known) if known else None,
            "j_per_token": token_joules / tokens if tokens else None,
            "settled": sum(bool(r.get("settled")) for r in records),
            "methods": dict(methods),
        })
    return rows


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    headers = ("route", "tier", "requests", "streamed", "tokens", "J/request", "J/token", "settled",
               "method mix")
    body = [(
        str(r["route"]), str(r["tier"]), str(r["requests"]), str(r["streamed"]),
        "unknown" if r["tokens"] is None else str(r["tokens"]),
        figure(r["j_per_request"]), figure(r["j_per_token"]), f"{r['settled']}/{r['requests']}",
        ", ".join(f"{m} {n}" for m, n in sorted(r["methods"].items())),
    ) for r in rows]
    widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h)
              for i, h in enumerate(headers)]
    right = {2, 3, 4, 5, 6, 7}

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in body)])
