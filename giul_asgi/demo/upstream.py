"""A simulated OpenAI-compatible inference server, and the simulated cards it runs on.

It answers what a gateway forwards to vLLM, TGI or a llama.cpp server:
``/v1/chat/completions`` and ``/v1/completions`` (plain and streamed, with
``stream_options.include_usage``), ``/v1/embeddings`` and ``/v1/models``. Each model runs
on an :class:`~giul_asgi.demo.engine.Engine` (a continuous batch) on one simulated card, so
answers take the time a real server's do and load the card while they run.

The cards are served the way a node's giul-agent serves real ones: ``GET /readings`` in the
agent wire schema (``"simulated": true``, so every figure read from it says ``simulated``),
``GET /healthz`` and ``GET /metrics`` (the engine's load with vLLM's metric names). A gateway
reads this server's cards over HTTP exactly as it reads a remote real one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import random
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from ..readers.simulated import SimulatedCard
from .engine import Engine, Speed

SCHEMA = "giul-agent/1"
WORDS = (
    "the", "card", "drew", "power", "while", "this", "answer", "was", "written", "out", "one",
    "token", "at", "a", "time", "and", "every", "step", "of", "batch", "shared", "its", "joules",
)


@dataclass(frozen=True, slots=True)
class SimGpu:
    """One simulated card: its name, idle floor and power cap."""

    index: int
    name: str
    idle_w: float
    cap_w: float
    counter_period: float = 0.1
    jitter: float = 0.1
    ramp_down_s: float = 0.04
    ramp_up_s: float = 0.005


@dataclass(frozen=True, slots=True)
class SimModel:
    """A model served on one card at one speed; ``embedding`` models only prefill."""

    name: str
    gpu: int
    speed: Speed = field(default_factory=Speed)
    embedding: bool = False
    dims: int = 64


#: Two cards (an H100-class and an L4-class one) and three models: what the demo serves.
DEFAULT_GPUS: tuple[SimGpu, ...] = (
    SimGpu(0, "Simulated H100 80GB", idle_w=70.0, cap_w=700.0),
    SimGpu(1, "Simulated L4 24GB", idle_w=16.0, cap_w=72.0),
)
DEFAULT_MODELS: tuple[SimModel, ...] = (
    SimModel("sim-70b", gpu=0, speed=Speed(step_s=0.03, step_s_per_seq=0.0015,
                                            prefill_s_per_token=0.0002, per_seq_w=230.0)),
    SimModel("sim-8b", gpu=1, speed=Speed(step_s=0.01, step_s_per_seq=0.0006,
                                           prefill_s_per_token=0.00005, per_seq_w=24.0)),
    SimModel("sim-embed", gpu=1, embedding=True,
             speed=Speed(step_s=0.004, step_s_per_seq=0.0002, prefill_s_per_token=0.00002,
                         per_seq_w=12.0)),
)


def create_app(**kwargs: Any) -> Starlette:
    """The upstream's ASGI app (``uvicorn --factory giul_asgi.demo.upstream:create_app``)."""
    return Upstream(**kwargs).app


class BadRequest(Exception):
    """An OpenAI-style client error: the status and the error object's fields."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"message": str(self), "type": self.kind,
                                       "param": self.param, "code": self.code}},
                            status_code=self.status)


class Upstream:
    """The cards, the engines on them, and the Starlette app that serves both."""

    def __init__(
        self,
        gpus: Sequence[SimGpu] = DEFAULT_GPUS,
        models: Sequence[SimModel] = DEFAULT_MODELS,
        *,
        token: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        seed: int | None = None,
    ) -> None:
        indices = [g.index for g in gpus]
        if len(set(indices)) != len(indices):
            raise ValueError("two simulated GPUs share an index")
        rng = random.Random(seed)
        self.gpus = {g.index: g for g in gpus}
        self.cards: dict[int, SimulatedCard] = {
            g.index: SimulatedCard(
                idle_w=g.idle_w, cap_w=g.cap_w, counter_period=g.counter_period, clock=clock,
                jitter=g.jitter, resolution_j=0.001, ramp_down_s=g.ramp_down_s,
                ramp_up_s=g.ramp_up_s, start_j=round(rng.uniform(1e5, 1e7), 3),
                seed=rng.randrange(2**32),
            )
            for g in gpus
        }
        self.models: dict[str, SimModel] = {}
        self.engines: dict[str, Engine] = {}
        for m in models:
            if m.gpu not in self.cards:
                raise ValueError(f"model {m.name!r} runs on GPU {m.gpu}, which is not simulated")
            self.models[m.name] = m
            self.engines[m.name] = Engine(self.cards[m.gpu], m.speed)
        self.token = token
        self.clock = clock
        self.host = socket.gethostname()
        self.started = int(time.time())
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/v1/embeddings", self.embeddings, methods=["POST"]),
                Route("/v1/models", self.list_models, methods=["GET"]),
                Route("/readings", self.readings, methods=["GET"]),
                Route("/healthz", self.healthz, methods=["GET"]),
                Route("/metrics", self.metrics, methods=["GET"]),
            ],
            lifespan=self._lifespan,
        )

    # -- lifecycle ------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        for engine in self.engines.values():
            engine.start()
        try:
            yield
        finally:
            for engine in self.engines.values():
                await engine.aclose()

    # -- the OpenAI-compatible API ---------------------------------------------------------
    async def chat(self, request: Request) -> Response:
        try:
            body = await _body(request)
            model = self._model(body, generating=True)
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise BadRequest("'messages' must be a non-empty list", param="messages")
            texts = []
            for i, message in enumerate(messages):
                if not isinstance(message, Mapping):
                    raise BadRequest(f"messages[{i}] must be an object", param="messages")
                texts.append(_content_text(message.get("content")))
            prompt_tokens = sum(count_tokens(t) + 4 for t in texts)
            return await self._generate(body, model, prompt_tokens, "\n".join(texts), chat=True)
        except BadRequest as exc:
            return exc.response()

    async def completions(self, request: Request) -> Response:
        try:
            body = await _body(request)
            model = self._model(body, generating=True)
            prompt = body.get("prompt")
            if isinstance(prompt, str):
                text = prompt
            elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                text = prompt[0]
            else:
                raise BadRequest("'prompt' must be a string (one prompt per request here)",
                                 param="prompt")
            return await self._generate(body, model, count_tokens(text), text, chat=False)
        except BadRequest as exc:
            return exc.response()

    async def embeddings(self, request: Request) -> Response:
        try:
            body = await _body(request)
            model = self._model(body, generating=False)
            raw = body.get("input")
            inputs = [raw] if isinstance(raw, str) else raw
            if (not isinstance(inputs, list) or not inputs
                    or not all(isinstance(x, str) for x in inputs)):
                raise BadRequest("'input' must be a string or a non-empty list of strings",
                                 param="input")
        except BadRequest as exc:
            return exc.response()
        engine = self.engines[model.name]
        tokens = [count_tokens(x) for x in inputs]
        for seq in [engine.submit(n, 0) for n in tokens]:
            await engine.wait(seq)
        data = [{"object": "embedding", "index": i, "embedding": _vector(x, model.dims)}
                for i, x in enumerate(inputs)]
        total = sum(tokens)
        return JSONResponse({"object": "list", "data": data, "model": model.name,
                             "usage": {"prompt_tokens": total, "total_tokens": total}})

    async def list_models(self, _request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": name, "object": "model", "created": self.started, "owned_by": "giul-asgi-demo"}
            for name in self.models
        ]})

    def _model(self, body: Mapping[str, Any], *, generating: bool) -> SimModel:
        name = body.get("model")
        if not isinstance(name, str) or not name:
            raise BadRequest("'model' is required", param="model")
        model = self.models.get(name)
        if model is None:
            raise BadRequest(f"The model `{name}` does not exist.", status=404, param="model",
                             code="model_not_found")
        if model.embedding == generating:
            what = "an embedding model" if model.embedding else "not an embedding model"
            raise BadRequest(f"`{name}` is {what}", param="model")
        return model

    async def _generate(self, body: Mapping[str, Any], model: SimModel, prompt_tokens: int,
                        prompt: str, *, chat: bool) -> Response:
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise BadRequest("'max_tokens' must be an integer >= 1", param="max_tokens")
        if body.get("n", 1) != 1:
            raise BadRequest("only n=1 is simulated", param="n")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise BadRequest("'stream' must be true or false", param="stream")
        options = body.get("stream_options") or {}
        if not isinstance(options, Mapping):
            raise BadRequest("'stream_options' must be an object", param="stream_options")
        natural = natural_length(prompt)
        wanted = natural if limit is None else min(limit, natural)
        reason = "stop" if limit is None or natural <= limit else "length"
        engine = self.engines[model.name]
        seq = engine.submit(prompt_tokens, wanted, ends_with=reason)
        words = _words(prompt)
        answer = Answer(chat=chat, model=model.name, prompt_tokens=prompt_tokens)
        if stream:
            include = bool(options.get("include_usage"))
            return StreamingResponse(self._stream(engine, seq, words, answer, include),
                                     media_type="text/event-stream",
                                     headers={"cache-control": "no-cache"})
        text = "".join([next(words) async for _ in engine.tokens(seq)])
        return JSONResponse(answer.whole(text, seq.finish_reason or reason, seq.generated))

    async def _stream(self, engine: Engine, seq: Any, words: Iterable[str], answer: Answer,
                      include_usage: bool) -> AsyncIterator[bytes]:
        it = iter(words)
        if answer.chat:
            yield answer.chunk({"role": "assistant", "content": ""}, None, include_usage)
        async for _ in engine.tokens(seq):
            yield answer.chunk({"content": next(it)} if answer.chat else next(it), None,
                               include_usage)
        yield answer.chunk({} if answer.chat else "", seq.finish_reason, include_usage)
        if include_usage:
            yield answer.usage_chunk(seq.generated)
        yield b"data: [DONE]\n\n"

    # -- the cards, as a giul-agent serves real ones ---------------------------------------
    async def readings(self, request: Request) -> Response:
        if self.token is not None and request.headers.get("authorization") != f"Bearer {self.token}":
            return JSONResponse({"error": "a bearer token is required"}, status_code=401,
                                headers={"www-authenticate": "Bearer"})
        gpus = []
        for index, card in self.cards.items():
            t = self.clock()
            gpus.append({
                "index": index, "uuid": f"GPU-sim-{index:04d}", "name": self.gpus[index].name,
                "t": t, "energy_j": card.energy_mj() / 1000.0, "power_w": round(card.instant_w(), 3),
                "mig": False, "error": None,
            })
        return JSONResponse({"schema": SCHEMA, "host": self.host, "simulated": True,
                             "now": self.clock(), "gpus": gpus})

    async def healthz(self, _request: Request) -> Response:
        return JSONResponse({"ok": True, "gpus": len(self.cards)})

    async def metrics(self, _request: Request) -> Response:
        lines = ["# TYPE vllm:num_requests_running gauge"]
        lines += [f'vllm:num_requests_running{{model_name="{n}"}} {e.running}'
                  for n, e in self.engines.items()]
        lines.append("# TYPE vllm:num_requests_waiting gauge")
        lines += [f'vllm:num_requests_waiting{{model_name="{n}"}} {e.waiting}'
                  for n, e in self.engines.items()]
        lines.append("# TYPE vllm:prompt_tokens_total counter")
        lines += [f'vllm:prompt_tokens_total{{model_name="{n}"}} {e.prompt_tokens_total}'
                  for n, e in self.engines.items()]
        lines.append("# TYPE vllm:generation_tokens_total counter")
        lines += [f'vllm:generation_tokens_total{{model_name="{n}"}} {e.generation_tokens_total}'
                  for n, e in self.engines.items()]
        lines.append("# TYPE giul_sim_energy_joules_total counter")
        lines += [f'giul_sim_energy_joules_total{{gpu="{i}"}} {c.energy_mj() / 1000.0}'
                  for i, c in self.cards.items()]
        return PlainTextResponse("\n".join(lines) + "\n",
                                 media_type="text/plain; version=0.0.4; charset=utf-8")


@dataclass(slots=True)
class Answer:
    """Writes one answer's objects in the OpenAI shapes (chat or text completion)."""

    chat: bool
    model: str
    prompt_tokens: int
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))

    def usage(self, completion: int) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion}

    def whole(self, text: str, finish_reason: str, completion: int) -> dict[str, Any]:
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                      "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {"id": self._id(), "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice],
                "usage": self.usage(completion)}

    def chunk(self, delta: dict[str, Any] | str, finish_reason: str | None,
              include_usage: bool) -> bytes:
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                                      "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish_reason}
        obj = self._head()
        obj["choices"] = [choice]
        if include_usage:
            obj["usage"] = None
        return _event(obj)

    def usage_chunk(self, completion: int) -> bytes:
        obj = self._head()
        obj["choices"] = []
        obj["usage"] = self.usage(completion)
        return _event(obj)

    def _id(self) -> str:
        return ("chatcmpl-" if self.chat else "cmpl-") + self.id

    def _head(self) -> dict[str, Any]:
        return {"id": self._id(),
                "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model}


def count_tokens(text: str) -> int:
    """A tokenizer's count, roughly: a token per four characters, at least one."""
    return max(1, math.ceil(len(text) / 4))


def natural_length(prompt: str) -> int:
    """Where the simulated model would stop on its own: 8 to 127 tokens, fixed by the prompt."""
    return 8 + _hash(prompt) % 120


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def _words(prompt: str) -> Any:
    rng = random.Random(_hash(prompt))
    while True:
        yield rng.choice(WORDS) + " "


def _vector(text: str, dims: int) -> list[float]:
    rng = random.Random(_hash(text))
    v = [rng.gauss(0.0, 1.0) for _ in range(dims)]
    norm = math.sqrt(sum(x * x for x in v)) or 1.0
    return [round(x / norm, 6) for x in v]


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: keep the text ones
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def _event(obj: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def _body(request: Request) -> Mapping[str, Any]:
    try:
        body = json.loads(await request.body())
    except ValueError:
        raise BadRequest("the body must be JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body
