"""Check the `remote` backend and `agentloop inference` against vLLM's own protocol definitions: the pydantic
models of its OpenAI-compatible server (CompletionRequest, CompletionResponse, LoadLoRAAdapterRequest, ...),
imported from the `vllm` package. vLLM needs a GPU to serve, not to import its protocol: `make vllm-protocol`
puts the wheel (pinned, without its CUDA dependencies) and the few pure-Python packages its protocol modules
import in `.vllm-protocol/`, apart from the project's environment.

    PYTHONPATH=.vllm-protocol python scripts/vllm_protocol.py [--model DIR] [--json]

It starts `agentloop inference` (AGENTLOOP_MODEL, or --model), drives it with `RemotePolicy` through a
transport that records every request and response, and checks:
- each request body the backend sends validates as vLLM's request model, and names only fields that model
  declares (vLLM ignores unknown fields with a warning: a misspelt option would silently do nothing);
- what vLLM makes of the completion request: its SamplingParams carry our temperature, max_tokens and
  logprobs=0 (the sampled token's log-prob);
- each response `agentloop inference` gives validates as vLLM's response model and has no field vLLM's
  lacks; its errors validate as vLLM's ErrorResponse.
Exit status 0 when every check passes; the last line is a JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx


class Recording(httpx.HTTPTransport):
    """A real HTTP transport that keeps (method, path, request JSON, status, response body) of each call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str, Any, int, bytes]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        body = response.read()
        sent = json.loads(request.content) if request.content else None
        self.calls.append((request.method, request.url.path, sent, response.status_code, body))
        return httpx.Response(response.status_code, headers=response.headers, content=body, request=request)


def vllm_models() -> dict[str, Any]:
    import vllm
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest, CompletionResponse
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse, ModelList
    from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest

    return {
        "version": vllm.__version__,
        "/v1/completions": (CompletionRequest, CompletionResponse),
        "/v1/load_lora_adapter": (LoadLoRAAdapterRequest, None),
        "/v1/unload_lora_adapter": (UnloadLoRAAdapterRequest, None),
        "/v1/models": (None, ModelList),
        "error": ErrorResponse,
    }


def undeclared(data: Any, model: Any, where: str) -> list[str]:
    """Keys of `data` (recursively, through nested pydantic models) that `model` does not declare."""
    import typing

    from pydantic import BaseModel

    out = []
    if not isinstance(data, dict):
        return out
    for key, value in data.items():
        field = model.model_fields.get(key)
        if field is None:
            out.append(f"{where}.{key}")
            continue
        for inner in _models_in(field.annotation, typing, BaseModel):
            items = value if isinstance(value, list) else [value]
            for item in items:
                out += undeclared(item, inner, f"{where}.{key}")
    return out


def _models_in(annotation: Any, typing: Any, base: type) -> list[Any]:
    if isinstance(annotation, type) and issubclass(annotation, base):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg, typing, base)]


def sampling_params(request_model: Any, body: dict[str, Any]) -> dict[str, Any]:
    """What vLLM's request model turns the body into (its SamplingParams), for the fields we rely on."""
    req = request_model.model_validate(body)
    try:
        params = req.to_sampling_params(body["max_tokens"], default_sampling_params={})
    except TypeError:  # its signature differs between versions
        params = req.to_sampling_params(default_max_tokens=body["max_tokens"], default_sampling_params={})
    return {"temperature": params.temperature, "max_tokens": params.max_tokens, "logprobs": params.logprobs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model directory (default: AGENTLOOP_MODEL)")
    ap.add_argument("--json", action="store_true", help="print only the JSON object")
    args = ap.parse_args()
    try:
        protocol = vllm_models()
    except ImportError as exc:
        print(f"vLLM's protocol modules do not import ({exc}); run `make vllm-protocol` and set "
              "PYTHONPATH=.vllm-protocol", file=sys.stderr)  # fmt: skip
        return 2

    from agentloop.policy.base import GenerationRequest
    from agentloop.policy.models import load_tokenizer
    from agentloop.policy.remote import InferenceError, RemotePolicy
    from agentloop.policy.server import start_process
    from agentloop.settings import get_settings

    settings = get_settings()
    model = args.model or settings.model
    # the server runs in the project's environment alone: vLLM's packages stay out of it
    pythonpath = os.pathsep.join(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if "vllm" not in p)
    log = Path(tempfile.mkdtemp()) / "inference.log"
    server, url = start_process(model, log, "--seed", "0", env={"PYTHONPATH": pythonpath})
    problems: list[str] = []
    checked: dict[str, int] = {}
    try:
        tokenizer = load_tokenizer(model, settings.models_dir)
        transport = Recording()
        policy = RemotePolicy([url], tokenizer, name="check", transport=transport)
        adapter = make_adapter(model, settings)
        policy.load_adapter("check@v1", str(adapter))
        ctx = tokenizer.encode("Check the protocol.", add_special_tokens=False)
        policy.generate([GenerationRequest(ctx, 8, 1.0), GenerationRequest(ctx, 6, 0.5, "check@v1")])
        with contextlib.suppress(InferenceError):  # an error response, as the backend meets one
            policy.generate([GenerationRequest(ctx, 10**6, 1.0)])
        httpx.get(f"{url}/v1/models")  # recorded below by hand: the backend reads it once
        policy.unload_adapter("check@v1")
        policy.close()
        models_body = httpx.get(f"{url}/v1/models").content
        calls = [*transport.calls, ("GET", "/v1/models", None, 200, models_body)]
        for method, path, sent, status, body in calls:
            request_model, response_model = protocol.get(path, (None, None))
            if sent is not None and request_model is not None:
                request_model.model_validate(sent)
                problems += [f"request field vLLM does not declare: {k}" for k in undeclared(sent, request_model, path)]
                if path == "/v1/completions":
                    got = sampling_params(request_model, sent)
                    want = {"temperature": sent["temperature"], "max_tokens": sent["max_tokens"], "logprobs": 0}
                    if got != want:
                        problems.append(f"vLLM reads {sent} as {got}, not {want}")
                checked[f"{method} {path} request"] = checked.get(f"{method} {path} request", 0) + 1
            if status >= 400:
                protocol["error"].model_validate_json(body)
                problems += [
                    f"error field vLLM lacks: {k}" for k in undeclared(json.loads(body), protocol["error"], "")
                ]
                checked["error response"] = checked.get("error response", 0) + 1
            elif response_model is not None:
                response_model.model_validate_json(body)
                extra = undeclared(json.loads(body), response_model, path)
                problems += [f"response field vLLM lacks: {k}" for k in extra]
                checked[f"{method} {path} response"] = checked.get(f"{method} {path} response", 0) + 1
    except Exception as exc:  # a validation error is a finding, with pydantic's own words
        problems.append(f"{type(exc).__name__}: {exc}")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    result = {"vllm": protocol["version"], "checked": checked, "problems": problems, "ok": not problems}
    if not args.json:
        for problem in problems:
            print(f"PROBLEM: {problem}")
        print(f"vLLM {protocol['version']}: {sum(checked.values())} messages checked, {len(problems)} problems")
    print(json.dumps(result, sort_keys=True))
    return 0 if not problems else 1


def make_adapter(model: str, settings: Any) -> Path:
    """A small LoRA adapter on the model (random weights), saved to a temporary directory."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from agentloop.policy.models import resolve_model_dir

    base = AutoModelForCausalLM.from_pretrained(resolve_model_dir(model, settings.models_dir))
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    path = Path(tempfile.mkdtemp()) / "adapter"
    peft_model.save_pretrained(path)
    return path


if __name__ == "__main__":
    raise SystemExit(main())
