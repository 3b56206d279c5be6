"""A simulated OpenAI-compatible inference server on a :class:`SimulatedCard`.

Each generation puts load on the card while it runs (as a batch slot would), so the
energy the middleware reads is caused by the requests it meters. It speaks enough of the
Chat Completions API for the real ``openai`` client: plain and streamed answers, with
``stream_options.include_usage``, ending with ``data: [DONE]``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..readers.simulated import SimulatedCard

WORDS = ("the", "card", "drew", "power", "while", "this", "answer", "was", "written", "out")


@dataclass
class Upstream:
    """Generates ``max_tokens`` words at ``token_seconds`` each, loading ``card``."""

    card: SimulatedCard
    watts_per_request: float = 120.0
    token_seconds: float = 0.002
    default_tokens: int = 16

    async def chat(self, request: Request) -> Response:
        try:
            payload = await request.json()
        except ValueError:
            return JSONResponse({"error": {"message": "body must be JSON"}}, status_code=400)
        if not isinstance(payload, dict):
            return JSONResponse({"error": {"message": "body must be an object"}}, status_code=400)
        model = str(payload.get("model", "sim-8b"))
        tokens = int(payload.get("max_tokens") or self.default_tokens)
        messages = payload.get("messages") or []
        prompt_tokens = sum(
            len(str(m.get("content", "")).split()) for m in messages if isinstance(m, dict)
        )
        if payload.get("stream"):
            include_usage = bool((payload.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(
                self._stream(model, tokens, prompt_tokens, include_usage),
                media_type="text/event-stream",
            )
        text = await self._generate(tokens)
        return JSONResponse({
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{
                "index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": " ".join(text)},
            }],
            "usage": _usage(prompt_tokens, tokens),
        })

    async def _generate(self, tokens: int) -> list[str]:
        job = self.card.start_job(self.watts_per_request)
        try:
            await anyio.sleep(self.token_seconds * tokens)
        finally:
            self.card.stop_job(job)
        return [WORDS[i % len(WORDS)] for i in range(tokens)]

    async def _stream(
        self, model: str, tokens: int, prompt_tokens: int, include_usage: bool
    ) -> AsyncIterator[bytes]:
        ident = f"chatcmpl-{uuid.uuid4().hex[:12]}"
        created = int(time.time())

        def event(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> bytes:
            obj: dict[str, Any] = {
                "id": ident, "object": "chat.completion.chunk", "created": created,
                "model": model, "choices": choices,
            }
            if include_usage:
                obj["usage"] = usage
            return b"data: " + json.dumps(obj).encode() + b"\n\n"

        job = self.card.start_job(self.watts_per_request)
        try:
            yield event([{"index": 0, "delta": {"role": "assistant", "content": ""},
                          "finish_reason": None}])
            for i in range(tokens):
                await anyio.sleep(self.token_seconds)
                word = WORDS[i % len(WORDS)] + " "
                yield event([{"index": 0, "delta": {"content": word}, "finish_reason": None}])
        finally:
            self.card.stop_job(job)
        yield event([{"index": 0, "delta": {}, "finish_reason": "stop"}])
        if include_usage:
            yield event([], _usage(prompt_tokens, tokens))
        yield b"data: [DONE]\n\n"


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}
