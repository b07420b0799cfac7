"""`agentloop inference`: the local model behind the endpoints of vLLM's OpenAI-compatible server that the
`remote` backend uses, so that inference runs apart from the workers (GPU-less or single-GPU deployments),
and so that the backend is tested here against a real server.

    GET  /v1/models                 the base model and every loaded adapter
    POST /v1/completions            prompt as token ids (or text); sampled token ids and per-token log-probs
    POST /v1/load_lora_adapter      {"lora_name", "lora_path"}: a PEFT directory this server can read
    POST /v1/unload_lora_adapter    {"lora_name"}
    GET  /health                    200 while the engine runs (no key needed)
    GET  /stats                     the engine's counters: steps, rows, requests that joined a running batch

Requests decode in one continuous batch (continuous.py). Options the engine cannot honour (n > 1, streaming,
top-p, stop strings, ...) are refused with 400 and say so, never silently ignored: a sample drawn from
another distribution than the one asked for would poison the learner's importance ratios. Fields it does not
know are ignored, as vLLM does. Errors have vLLM's shape: {"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from agentloop.policy.base import GenerationRequest
from agentloop.policy.continuous import ContinuousBatcher, UnknownAdapter

# fields of vLLM's CompletionRequest that would change what is sampled or returned, with the value under
# which they change nothing: any other value is refused
NEUTRAL: dict[str, Any] = {
    "n": 1,
    "best_of": None,
    "stream": False,
    "echo": False,
    "suffix": None,
    "top_p": None,
    "top_k": None,
    "min_p": None,
    "frequency_penalty": None,
    "presence_penalty": None,
    "repetition_penalty": None,
    "logit_bias": None,
    "stop": None,
    "stop_token_ids": None,
    "ignore_eos": False,
    "min_tokens": 0,
    "seed": None,
    "use_beam_search": False,
    "allowed_token_ids": None,
    "bad_words": None,
    "prompt_logprobs": None,
    "response_format": None,
    "structured_outputs": None,
    "guided_json": None,
    "guided_regex": None,
    "guided_choice": None,
    "guided_grammar": None,
    "prompt_embeds": None,
    "truncate_prompt_tokens": None,
}
EMPTY_IS_NEUTRAL = {"stop", "stop_token_ids", "bad_words", "logit_bias"}
MAX_LOGPROBS = 0  # the sampled token's log-prob only (its top-k alternatives are not computed)


class CompletionBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    prompt: list[int] | list[list[int]] | str | list[str]
    max_tokens: int | None = Field(16, ge=1)
    temperature: float | None = Field(None, ge=0)
    logprobs: int | None = Field(None, ge=0)
    skip_special_tokens: bool | None = True
    return_token_ids: bool | None = False
    return_tokens_as_token_ids: bool | None = False


class LoadBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)


class UnloadBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    lora_name: str = Field(min_length=1)


class ServerError(Exception):
    def __init__(self, code: int, message: str, kind: str = "BadRequestError", param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.kind, self.param = code, message, kind, param


def error_body(code: int, message: str, kind: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def create_app(engine: ContinuousBatcher, model_name: str, api_key: str | None = None) -> FastAPI:
    app = FastAPI(title="agentloop inference", docs_url=None, redoc_url=None)
    tokenizer = engine.tokenizer
    config = getattr(engine.policy.model, "config", None)
    max_model_len = int(getattr(config, "max_position_embeddings", 0) or 0) or None
    vocab = int(getattr(config, "vocab_size", 0) or len(tokenizer))
    created = int(time.time())

    @app.exception_handler(ServerError)
    async def _server_error(_: Request, exc: ServerError) -> JSONResponse:
        return JSONResponse(error_body(exc.code, exc.message, exc.kind, exc.param), status_code=exc.code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = f"{where}: {first.get('msg', 'invalid request')}" if where else str(first.get("msg", "invalid"))
        return JSONResponse(error_body(400, message, "BadRequestError", where or None), status_code=400)

    @app.middleware("http")
    async def _auth(request: Request, call_next: Any) -> Any:
        if api_key and request.url.path != "/health":
            sent = request.headers.get("authorization", "")
            if not hmac.compare_digest(sent.encode(), f"Bearer {api_key}".encode()):
                return JSONResponse(error_body(401, "Unauthorized", "AuthenticationError"), status_code=401)
        return await call_next(request)

    @app.get("/health")
    async def health() -> PlainTextResponse:
        return PlainTextResponse("")

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        return {
            "steps": engine.steps,
            "joined_running": engine.joined_running,
            "most_rows": engine.most_rows,
            "most_adapters": engine.most_adapters,
            "prefix_hits": engine.prefix_hits,
            "registered": sorted(engine.registered()),
            "resident": engine.resident(),
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        def card(name: str, root: str, parent: str | None) -> dict[str, Any]:
            return {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "agentloop",
                "root": root,
                "parent": parent,
                "max_model_len": max_model_len,
                "permission": [],
            }

        cards = [card(model_name, model_name, None)]
        cards += [card(name, path, model_name) for name, path in sorted(engine.registered().items())]
        return {"object": "list", "data": cards}

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(body: LoadBody) -> PlainTextResponse:
        try:
            await asyncio.to_thread(engine.register, body.lora_name, body.lora_path)
        except FileNotFoundError as exc:
            raise ServerError(404, str(exc), "NotFoundError", "lora_path") from None
        except ValueError as exc:
            raise ServerError(400, str(exc), "InvalidUserInput", "lora_name") from None
        except Exception as exc:  # PEFT refused it (another base model, a broken file)
            message = f"adapter {body.lora_name!r} could not be loaded: {type(exc).__name__}: {exc}"
            raise ServerError(400, message) from None
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(body: UnloadBody) -> PlainTextResponse:
        try:
            engine.unregister(body.lora_name)
        except UnknownAdapter as exc:
            raise ServerError(404, str(exc), "NotFoundError", "lora_name") from None
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

    @app.post("/v1/completions")
    async def completions(body: CompletionBody) -> dict[str, Any]:
        refuse_unsupported(body)
        adapter = None
        if body.model is not None and body.model != model_name:
            if body.model not in engine.registered():
                raise ServerError(404, f"The model `{body.model}` does not exist.", "NotFoundError", "model")
            adapter = body.model
        prompts = token_prompts(body.prompt, tokenizer)
        max_tokens = body.max_tokens or 16
        temperature = 1.0 if body.temperature is None else body.temperature
        for ids in prompts:
            if not ids:
                raise ServerError(400, "the prompt is empty", param="prompt")
            bad = next((t for t in ids if not 0 <= t < vocab), None)
            if bad is not None:
                raise ServerError(400, f"token id {bad} is out of vocabulary (0..{vocab - 1})", param="prompt")
            if max_model_len is not None and len(ids) + max_tokens > max_model_len:
                raise ServerError(
                    400,
                    f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                    f"{len(ids) + max_tokens} tokens ({len(ids)} in the prompt, {max_tokens} for the completion).",
                    param="max_tokens",
                )
        try:
            futures = [engine.submit(GenerationRequest(ids, max_tokens, temperature, adapter)) for ids in prompts]
            gens = [await asyncio.wrap_future(f) for f in futures]
        except UnknownAdapter:  # unloaded while the request waited
            raise ServerError(404, f"The model `{body.model}` does not exist.", "NotFoundError", "model") from None
        choices = []
        for i, (ids, gen) in enumerate(zip(prompts, gens, strict=True)):
            choice: dict[str, Any] = {
                "index": i,
                "text": gen.text,
                "logprobs": None,
                "finish_reason": gen.finish_reason,
                "stop_reason": None,
            }
            if body.logprobs is not None:
                names = [
                    f"token_id:{t}" if body.return_tokens_as_token_ids else tokenizer.decode([t]) for t in gen.token_ids
                ]
                offsets, at = [], 0
                for name in names:
                    offsets.append(at)
                    at += len(name)
                choice["logprobs"] = {
                    "text_offset": offsets,
                    "token_logprobs": gen.logprobs,
                    "tokens": names,
                    "top_logprobs": [{n: lp} for n, lp in zip(names, gen.logprobs or [], strict=True)],
                }
            if body.return_token_ids:
                choice["token_ids"] = gen.token_ids
                choice["prompt_token_ids"] = ids
            choices.append(choice)
        prompt_tokens = sum(len(p) for p in prompts)
        completion_tokens = sum(len(g.token_ids) for g in gens)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.model or model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    return app


def refuse_unsupported(body: CompletionBody) -> None:
    extra = body.model_extra or {}
    for name, neutral in NEUTRAL.items():
        if name not in extra:
            continue
        value = extra[name]
        if value == neutral or value is None or (name in EMPTY_IS_NEUTRAL and not value):
            continue
        raise ServerError(400, f"{name}={value!r} is not supported by agentloop inference", param=name)
    if body.logprobs is not None and body.logprobs > MAX_LOGPROBS:
        raise ServerError(
            400,
            f"logprobs={body.logprobs} is not supported: agentloop inference returns the sampled token's "
            "log-prob only (logprobs=0)",
            param="logprobs",
        )
    if body.skip_special_tokens is False:
        raise ServerError(400, "skip_special_tokens=false is not supported", param="skip_special_tokens")


def token_prompts(prompt: Any, tokenizer: Any) -> list[list[int]]:
    if isinstance(prompt, str):
        return [tokenizer.encode(prompt, add_special_tokens=False)]
    if prompt and isinstance(prompt[0], str):
        return [tokenizer.encode(p, add_special_tokens=False) for p in prompt]
    if prompt and isinstance(prompt[0], list):
        return [list(p) for p in prompt]
    return [list(prompt)]


def start_process(
    model: str | Path, log: Path, *options: str, env: dict[str, str] | None = None, timeout_s: float = 300.0
) -> tuple[subprocess.Popen[bytes], str]:
    """`agentloop inference` serving `model` as a child process (its own session, so that its group can be
    killed) on a free local port, once it answers /health: the process and its base URL. `env` adds to this
    process's environment. RuntimeError, with the end of its log, if it exits or does not answer in time."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "agentloop.cli", "inference", "--port", str(port), *options]
    environ = {**os.environ, "AGENTLOOP_MODEL": str(model), **(env or {})}
    with open(log, "wb") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(cmd, env=environ, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"agentloop inference exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"agentloop inference did not answer in {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
