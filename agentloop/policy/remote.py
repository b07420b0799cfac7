"""The `remote` backend: inference on servers that speak vLLM's OpenAI-compatible protocol (vLLM itself, or
`agentloop inference`), token in, token out.

- `POST /v1/completions` with the context as token ids (never re-tokenised), `return_token_ids` for the
  sampled ids and `logprobs=0` for each one's log-prob; `model=<adapter>` picks the adapter per request, so
  episodes of different tenants share the servers' batches.
- Adapters: `POST /v1/load_lora_adapter` on every replica, under the versioned name the runner gives (a name
  is never reloaded with other weights: servers keep a prefix cache per name). A replica that answers a
  request with "no such model" for an adapter this process loaded (it restarted, or another worker unloaded
  it) gets it again, and the request is retried once.
- Replicas: an episode stays on one replica (its prefix cache is there) while that replica answers. Connection
  errors, timeouts, 5xx and 429 are retried with backoff; a replica that fails every try is skipped for
  `inference_down_s` and the episode moves to another (the whole context goes with each request, so nothing
  is lost). With none left the call fails with each replica's reason, which ends the episode with it.
- A response that is not what the protocol says (not JSON, truncated, token ids and log-probs of different
  lengths, ids out of the vocabulary) is an error naming the server and what was wrong: no half turn is kept.

Log-probs: vLLM returns the model's raw log-probs unless started with `--logprobs-mode processed_logprobs`
(those of the temperature-scaled distribution actually sampled from). The learner recomputes pi_old for
rollouts sampled by a server either way (DESIGN §5), so the gap between the two is a metric, not an error.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from agentloop.policy.base import Generation, GenerationRequest
from agentloop.settings import ConfigError, Settings

log = logging.getLogger(__name__)


class InferenceError(RuntimeError):
    """A server refused a request or answered outside the protocol: retrying the same request will not help."""


class InferenceUnavailable(InferenceError):
    """No replica answered (every one down, timing out or failing with 5xx through its retries)."""


class _Retryable(Exception):
    pass


class _AdapterMissing(Exception):
    pass


@dataclass
class Replica:
    url: str
    down_until: float = 0.0
    last_error: str = ""
    pinned: int = 0  # episodes on it now


class RemotePolicy:
    """`Policy` over one or more OpenAI-compatible inference servers."""

    def __init__(
        self,
        urls: Sequence[str],
        tokenizer: Any,
        name: str,
        model: str = "",
        api_key: str = "",
        timeout_s: float = 120.0,
        retries: int = 2,
        backoff_s: float = 0.5,
        down_s: float = 10.0,
        max_parallel: int = 64,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not urls:
            raise ConfigError("the remote policy backend needs AGENTLOOP_INFERENCE_URLS (comma-separated base URLs)")
        self.replicas = [Replica(u.rstrip("/")) for u in urls]
        self.tokenizer = tokenizer
        self.name = name
        self.retries = retries
        self.backoff_s = backoff_s
        self.down_s = down_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)),
            limits=httpx.Limits(max_connections=max_parallel, max_keepalive_connections=max_parallel),
            transport=transport,
        )
        self._pool = ThreadPoolExecutor(max_workers=max_parallel, thread_name_prefix="inference")
        self._lock = threading.Lock()
        self._adapters: dict[str, str] = {}  # loaded through this process: name -> path
        self._pins: dict[str, Replica] = {}  # episode key -> its replica
        self._next = 0
        self.vocab_size = len(tokenizer)
        eos = tokenizer.eos_token_id
        self.stop_ids = {int(e) for e in (eos if isinstance(eos, list) else [eos])}
        self._model = model
        self.moved = 0  # episodes moved off a replica that went down

    @classmethod
    def from_settings(cls, settings: Settings) -> RemotePolicy:
        from agentloop.policy.models import load_tokenizer

        urls = [u.strip() for u in (settings.inference_urls or "").split(",") if u.strip()]
        return cls(
            urls,
            load_tokenizer(settings.model, settings.models_dir),
            name=settings.model_name,
            model=settings.inference_model or "",
            api_key=settings.inference_api_key or "",
            timeout_s=settings.inference_timeout_s,
            retries=settings.inference_retries,
            backoff_s=settings.inference_backoff_s,
            down_s=settings.inference_down_s,
            max_parallel=max(settings.max_batch_size, 8) * 4,
        )

    @property
    def model(self) -> str:
        """The base model's name on the servers (asked of them on first use unless configured)."""
        if not self._model:
            self._model = self._served_model()
        return self._model

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()

    # --- adapters ------------------------------------------------------------------------------
    def load_adapter(self, name: str, path: str) -> None:
        """Load on every replica that answers; a replica that is down gets it when it next misses it."""
        with self._lock:
            if name in self._adapters:
                return
        reasons = []
        for replica in self.replicas:
            try:
                self._load_on(replica, name, path)
            except InferenceUnavailable as exc:
                reasons.append(str(exc))
        if len(reasons) == len(self.replicas):
            raise InferenceUnavailable(f"adapter {name!r} could not be loaded on any replica: " + "; ".join(reasons))
        with self._lock:
            self._adapters[name] = path

    def unload_adapter(self, name: str) -> None:
        with self._lock:
            if self._adapters.pop(name, None) is None:
                return
        for replica in self.replicas:
            try:
                self._post(replica, "/v1/unload_lora_adapter", {"lora_name": name}, tries=1)
            except (InferenceError, _AdapterMissing) as exc:  # gone already, or the replica is: nothing to free
                log.info("unloading %s on %s: %s", name, replica.url, exc)

    def loaded_adapters(self) -> set[str]:
        with self._lock:
            return set(self._adapters)

    def _load_on(self, replica: Replica, name: str, path: str) -> None:
        try:
            self._post(replica, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
        except InferenceError as exc:
            if "already" in str(exc).lower():  # loaded there before (by this or another worker): the same files
                return
            raise

    # --- sampling --------------------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """One request per row, all in flight at once: the server batches them with everyone else's."""
        futures = [self._pool.submit(self._generate_one, r) for r in requests]
        return [f.result() for f in futures]

    def end_episode(self, key: str) -> None:
        with self._lock:
            replica = self._pins.pop(key, None)
            if replica is not None:
                replica.pinned -= 1

    def _generate_one(self, req: GenerationRequest) -> Generation:
        body = {
            "model": req.adapter or self.model,
            "prompt": list(req.context),
            "max_tokens": req.max_new_tokens,
            "temperature": req.temperature,
            "logprobs": 0,
            "return_token_ids": True,
            "skip_special_tokens": True,
        }
        tried: list[str] = []
        while True:
            replica = self._replica_for(req.key, exclude=tried)
            if replica is None:
                reasons = "; ".join(f"{r.url}: {r.last_error or 'down'}" for r in self.replicas)
                raise InferenceUnavailable(f"no inference replica answered ({reasons})")
            try:
                try:
                    data = self._post(replica, "/v1/completions", body)
                except _AdapterMissing:
                    path = self._adapters.get(req.adapter or "")
                    if path is None:
                        raise InferenceError(f"{replica.url}: adapter {req.adapter!r} is not loaded") from None
                    log.info("%s lost adapter %s; loading it again", replica.url, req.adapter)
                    self._load_on(replica, req.adapter or "", path)
                    data = self._post(replica, "/v1/completions", body)
                return self._parse(replica, data, req)
            except InferenceUnavailable:
                tried.append(replica.url)
                if req.key is not None:
                    self.end_episode(req.key)
                    self.moved += 1
            except _AdapterMissing:
                raise InferenceError(f"{replica.url}: adapter {req.adapter!r} is missing even after loading") from None

    def _replica_for(self, key: str | None, exclude: list[str]) -> Replica | None:
        now = time.monotonic()
        with self._lock:
            pinned = self._pins.get(key) if key is not None else None
            if pinned is not None and pinned.url not in exclude and pinned.down_until <= now:
                return pinned
            up = [r for r in self.replicas if r.url not in exclude and r.down_until <= now]
            if not up:
                return None
            choice = min(up, key=lambda r: (r.pinned, (self.replicas.index(r) - self._next) % len(self.replicas)))
            self._next = (self.replicas.index(choice) + 1) % len(self.replicas)
            if key is not None:
                if pinned is not None:
                    pinned.pinned -= 1
                self._pins[key] = choice
                choice.pinned += 1
            return choice

    def _post(self, replica: Replica, path: str, body: dict[str, Any], tries: int | None = None) -> Any:
        """POST with retries; InferenceUnavailable once the replica failed every try (it is marked down)."""
        tries = self.retries + 1 if tries is None else tries
        reason = ""
        for attempt in range(tries):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                return self._post_once(replica, path, body)
            except _Retryable as exc:
                reason = str(exc)
                log.warning("%s%s: %s (try %d of %d)", replica.url, path, reason, attempt + 1, tries)
        with self._lock:
            replica.down_until = time.monotonic() + self.down_s
            replica.last_error = reason
        raise InferenceUnavailable(f"{replica.url}: {reason}")

    def _post_once(self, replica: Replica, path: str, body: dict[str, Any]) -> Any:
        try:
            resp = self._http.post(replica.url + path, json=body)
        except httpx.TimeoutException as exc:
            raise _Retryable(f"timed out ({type(exc).__name__})") from None
        except httpx.TransportError as exc:
            raise _Retryable(f"unreachable ({type(exc).__name__}: {exc})") from None
        if resp.status_code >= 500 or resp.status_code == 429:
            raise _Retryable(f"HTTP {resp.status_code}: {_message(resp)}")
        if resp.status_code == 404 and body.get("model") and "does not exist" in _message(resp):
            raise _AdapterMissing(_message(resp))
        if resp.status_code >= 400:
            raise InferenceError(f"{replica.url}{path}: HTTP {resp.status_code}: {_message(resp)}")
        if path != "/v1/completions":
            return resp.text
        try:
            return resp.json()
        except ValueError:
            raise InferenceError(f"{replica.url}{path}: the response is not JSON: {resp.text[:200]!r}") from None

    def _parse(self, replica: Replica, data: Any, req: GenerationRequest) -> Generation:
        """The one choice of a completion response, checked against what was asked."""

        def bad(what: str) -> InferenceError:
            return InferenceError(f"{replica.url}/v1/completions: malformed response: {what}")

        try:
            choice = data["choices"][0]
        except (TypeError, KeyError, IndexError):
            raise bad("no choices") from None
        if not isinstance(choice, dict):
            raise bad("a choice is not an object")
        ids = choice.get("token_ids")
        if ids is None:
            raise bad("no token_ids (the server must support return_token_ids: vLLM >= 0.10.2)")
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
        if not isinstance(ids, list) or not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in ids):
            raise bad("token_ids is not a list of token ids of this model's vocabulary")
        if not ids:
            raise bad("no tokens were sampled")
        if len(ids) > req.max_new_tokens:
            raise bad(f"{len(ids)} tokens for max_tokens={req.max_new_tokens}")
        if not isinstance(logprobs, list) or len(logprobs) != len(ids):
            raise bad(f"{len(logprobs) if isinstance(logprobs, list) else 'no'} log-probs for {len(ids)} tokens")
        if not all(isinstance(lp, (int, float)) and math.isfinite(lp) and lp <= 1e-4 for lp in logprobs):
            raise bad("a log-prob is not a finite number <= 0")
        finish = choice.get("finish_reason")
        if finish not in ("stop", "length"):
            raise bad(f"finish_reason {finish!r}")
        text_ids = ids[:-1] if ids[-1] in self.stop_ids else ids
        text = self.tokenizer.decode(text_ids, skip_special_tokens=True)
        return Generation(list(ids), [float(lp) for lp in logprobs], finish, text)

    def _served_model(self) -> str:
        """The base model's name: the first entry of /v1/models on the first replica that answers."""
        reasons = []
        for replica in self.replicas:
            try:
                resp = self._http.get(replica.url + "/v1/models")
                if resp.status_code == 200:
                    data = resp.json()["data"]
                    base = [m["id"] for m in data if not m.get("parent")]
                    return str((base or [data[0]["id"]])[0])
                reasons.append(f"{replica.url}: HTTP {resp.status_code}: {_message(resp)}")
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
                reasons.append(f"{replica.url}: {type(exc).__name__}: {exc}")
        raise InferenceUnavailable(
            "cannot learn the served model's name (set AGENTLOOP_INFERENCE_MODEL, or start a server): "
            + "; ".join(reasons)
        )


def _message(resp: httpx.Response) -> str:
    """An error response's message: vLLM's {"error": {"message"}} or its older {"message"}, else the text."""
    try:
        data = resp.json()
    except ValueError:
        return resp.text[:200]
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if "message" in data:
            return str(data["message"])
        if "detail" in data:
            return str(data["detail"])
    return str(data)[:200]
