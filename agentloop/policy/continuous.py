"""Continuous batching over the local model: what `agentloop inference` serves with.

One thread owns the model. Requests are queued from any thread; between two decode steps the thread admits
the queued ones (each is prefilled alone, from the longest kept prefix of an earlier sequence; those that
arrived meanwhile too, and all of them join the running batch in one rebuild), samples one token for every
running row, hands back the rows that finished and runs the next decode step. A request that arrives while
others decode therefore starts at the next step, not when the batch drains. Rows on different adapters
decode in the same forward (mixed_lora.py).

The batch cache is left-padded: row b's keys/values sit at the right of a common width, padding is masked,
and every real token keeps its own position. A row joining wider than the batch pads the batch. A finished
row's slot is fed padding until the next rebuild (rows join, or finished rows outnumber running ones), which
drops it and cuts the padding no row needs any more. Contexts are kept for reuse (a token budget, least
recently used first) when prefilled and again when their row ends.

Adapters are registered by name and path (`register`, as vLLM's `/v1/load_lora_adapter`). At most
`max_loras` are resident in the model; a request on a registered adapter that is not resident loads it
between steps, evicting the least recently used one no running row is on.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from agentloop.policy import mixed_lora
from agentloop.policy.base import Generation, GenerationRequest
from agentloop.policy.local import SHARED_MIN_TOKENS, LocalPolicy, common_length
from agentloop.policy.models import output_cache

log = logging.getLogger(__name__)

T = TypeVar("T")
PREFILL_CHUNK = 2048  # new tokens per prefill forward: attention scores of one long row stay small


class UnknownAdapter(KeyError):
    """A request names an adapter that is not registered (or was unregistered while it waited)."""

    def __str__(self) -> str:
        return str(self.args[0])


class EngineStopped(RuntimeError):
    pass


@dataclass
class _Row:
    req: GenerationRequest
    future: Future[Generation]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    done: bool = False  # finished and answered; its slot stays in the batch until the batch is rebuilt


@dataclass
class _Kept:
    tokens: list[int]
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (heads, len(tokens), head_dim)
    adapter: str | None


class ContinuousBatcher:
    """`submit(request)` returns a Future of its Generation; `generate(requests)` waits for all of them."""

    def __init__(
        self,
        policy: LocalPolicy,
        max_rows: int = 16,
        max_batch_tokens: int = 65536,
        max_loras: int = 8,
        prefix_cache_tokens: int = 32768,
        seed: int | None = None,
    ) -> None:
        self.policy = policy
        self.tokenizer = policy.tokenizer
        self.max_rows = max_rows
        self.max_batch_tokens = max_batch_tokens
        self.max_loras = max_loras
        self.prefix_cache_tokens = prefix_cache_tokens
        self._generator = torch.Generator(device=policy.model.device)
        if seed is not None:
            self._generator.manual_seed(seed)
        else:
            self._generator.seed()
        self._cv = threading.Condition()
        self._queue: deque[_Row] = deque()
        self._controls: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._registry: dict[str, str] = {}  # adapter name -> path, as registered
        self._used: OrderedDict[str, None] = OrderedDict()  # resident adapters, least recently used first
        self._rows: list[_Row] = []
        self._cache: Any = None  # the running rows' keys/values: a DynamicCache, per layer (rows, heads, width, dim)
        self._mask = torch.zeros((0, 0), dtype=torch.long)
        self._logits: torch.Tensor | None = None  # (rows, vocab): the next token's, for the running rows
        self._kept: OrderedDict[int, _Kept] = OrderedDict()
        self._kept_tokens = 0
        self._kept_serial = 0
        self._mixed: mixed_lora.MixedLora | None = None
        self._stacked: bool | None = None  # whether the resident adapters allow the stacked LoRA terms
        self._joining: set[str | None] = set()  # adapters of the rows running or being admitted
        self._stopped = False
        # counters (read by /metrics-style callers and tests)
        self.steps = 0
        self.joined_running = 0  # rows admitted while other rows were decoding
        self.most_rows = 0
        self.most_adapters = 0  # most distinct adapters (the base model counts as one) in one decode step
        self.prefix_hits = 0
        self._thread = threading.Thread(target=self._loop, name="continuous-batcher", daemon=True)
        self._thread.start()

    # --- the interface ------------------------------------------------------------------------
    def submit(self, req: GenerationRequest) -> Future[Generation]:
        if len(req.context) == 0:
            raise ValueError("cannot generate from an empty context")
        if req.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        future: Future[Generation] = Future()
        with self._cv:
            if self._stopped:
                raise EngineStopped("the batcher is stopped")
            if req.adapter is not None and req.adapter not in self._registry:
                raise UnknownAdapter(f"adapter {req.adapter!r} is not loaded")
            self._queue.append(_Row(req, future))
            self._cv.notify_all()
        return future

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        futures = [self.submit(r) for r in requests]
        return [f.result() for f in futures]

    def register(self, name: str, path: str) -> None:
        """Register adapter `name` (a PEFT directory) and load it now, so that a bad one is refused here."""
        if not Path(path, "adapter_config.json").exists():
            raise FileNotFoundError(f"adapter {name!r}: no adapter_config.json in {path}")
        with self._cv:
            if name in self._registry:
                raise ValueError(f"adapter {name!r} is already loaded")
        self._call(lambda: self._register(name, path))

    def unregister(self, name: str) -> None:
        """Forget adapter `name`: requests waiting for it fail; it leaves the model once no running row is on it."""
        with self._cv:
            if name not in self._registry:
                raise UnknownAdapter(f"adapter {name!r} is not loaded")
            del self._registry[name]
            waiting = [r for r in self._queue if r.req.adapter == name]
            for row in waiting:
                self._queue.remove(row)
                row.future.set_exception(UnknownAdapter(f"adapter {name!r} was unloaded"))
            self._cv.notify_all()

    def registered(self) -> dict[str, str]:
        with self._cv:
            return dict(self._registry)

    def resident(self) -> list[str]:
        with self._cv:
            return list(self._used)

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify_all()
        self._thread.join(timeout=30)

    # --- the engine thread -------------------------------------------------------------------
    def _call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the engine thread between two steps (it owns the model), and return its result."""
        future: Future[T] = Future()
        with self._cv:
            if self._stopped:
                raise EngineStopped("the batcher is stopped")
            self._controls.append((fn, future))
            self._cv.notify_all()
        return future.result()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not (self._stopped or self._queue or self._controls or self._rows):
                    self._cv.wait()
                if self._stopped:
                    break
                controls = list(self._controls)
                self._controls.clear()
            for fn, future in controls:
                try:
                    future.set_result(fn())
                except BaseException as exc:  # the caller gets it
                    future.set_exception(exc)
            try:
                self._admit()
                if self._rows:
                    self._step()
                if not self._rows:  # idle: the model is left as it was (no hooks on it)
                    self._close_mixed()
                self._evict_unregistered()
            except Exception as exc:  # e.g. out of memory: the running rows fail, the engine goes on
                log.exception("decode step failed; %d running requests fail with it", len(self._rows))
                for row in self._rows:
                    if not row.future.done():
                        row.future.set_exception(exc)
                self._reset_batch()
        self._close_mixed()
        with self._cv:
            for row in [*self._rows, *self._queue]:
                if not row.future.done():
                    row.future.set_exception(EngineStopped("the batcher stopped"))

    def _register(self, name: str, path: str) -> None:
        self._make_resident(name, path)
        with self._cv:
            self._registry[name] = path

    def _make_resident(self, name: str, path: str) -> None:
        if name in self._used:
            with self._cv:
                self._used.move_to_end(name)
            return
        running = self._running() | self._joining
        while len(self._used) >= self.max_loras:
            idle = next((n for n in self._used if n not in running), None)
            if idle is None:
                raise RuntimeError(f"all {self.max_loras} resident adapters are in use")
            self._evict(idle)
        self._close_mixed()
        self.policy.load_adapter(name, path)
        with self._cv:
            self._used[name] = None

    def _evict(self, name: str) -> None:
        self._close_mixed()
        self.policy.unload_adapter(name)
        with self._cv:
            self._used.pop(name, None)
        for key in [k for k, kept in self._kept.items() if kept.adapter == name]:
            self._forget(key)

    def _evict_unregistered(self) -> None:
        """Adapters unloaded by name leave the model once no running row is on them."""
        with self._cv:
            gone = [n for n in self._used if n not in self._registry]
        running = self._running()
        for name in gone:
            if name not in running:
                self._evict(name)

    def _close_mixed(self) -> None:
        self._stacked = None
        if self._mixed is not None:
            self._mixed.__exit__(None, None, None)
            self._mixed = None

    def _route(self, adapters: Sequence[str | None]) -> dict[str, Any]:
        """Forward kwargs that send row b through adapters[b] (the stacked LoRA terms when PEFT's layers
        allow, else PEFT's own mixed batch); nothing when no adapter is resident."""
        if not self._used:
            return {}
        names = list(self._used)
        if self._stacked is None:
            self._stacked = mixed_lora.supported(self.policy.model, names)
        if self._stacked:
            if self._mixed is None:
                self._mixed = mixed_lora.MixedLora(self.policy.model, names).__enter__()
            self._mixed.route(adapters)
            return {}
        return {"adapter_names": [a if a is not None else "__base__" for a in adapters]}

    def _admit(self) -> None:
        """Queued requests join the batch, oldest first, while rows and the token budget allow. Each is
        prefilled alone; those that arrive while others prefill are taken too, and all of them join the
        batch in one copy of its cache."""
        joining: list[tuple[_Row, list[torch.Tensor], list[torch.Tensor], torch.Tensor]] = []
        while len(self._live()) + len(joining) < self.max_rows:
            with self._cv:
                row = self._next_admissible(joining)
                if row is None:
                    break
            try:
                joining.append((row, *self._prefill_row(row)))
            except Exception as exc:
                log.warning("request could not start: %s: %s", type(exc).__name__, exc)
                row.future.set_exception(exc)
        self._joining = set()
        if joining:
            if self._rows:
                self.joined_running += len(joining)
            self._merge(joining)
            self.most_rows = max(self.most_rows, len(self._rows))

    def _next_admissible(self, joining: list[Any]) -> _Row | None:
        """The oldest queued request that fits now (under the lock); a request on an adapter that cannot be
        made resident yet (all slots in use) waits without holding back the others."""
        rows = [*self._live(), *(j[0] for j in joining)]
        width = max([self._mask.shape[1], *(len(j[0].req.context) for j in joining)])
        running = {r.req.adapter for r in rows}
        for row in list(self._queue):
            if row.future.cancelled():
                self._queue.remove(row)
                continue
            need = len(row.req.context) + row.req.max_new_tokens
            if rows and max(width, need) * (len(rows) + 1) > self.max_batch_tokens:
                return None  # the batch is full by tokens: the next step frees room
            adapter = row.req.adapter
            if adapter is not None:
                if adapter not in self._registry:
                    self._queue.remove(row)
                    row.future.set_exception(UnknownAdapter(f"adapter {adapter!r} is not loaded"))
                    continue
                if adapter not in self._used and len(self._used) >= self.max_loras and self._used.keys() <= running:
                    continue
            self._queue.remove(row)
            self._joining = running | {adapter}
            return row
        return None

    def _prefill_row(self, row: _Row) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
        req = row.req
        if req.adapter is not None:
            path = self.registered().get(req.adapter)
            if path is None:
                raise UnknownAdapter(f"adapter {req.adapter!r} was unloaded")
            self._make_resident(req.adapter, path)
        return self._prefill(req)

    @torch.inference_mode()
    def _prefill(self, req: GenerationRequest) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
        """The row's context through the model from its longest kept prefix: per layer keys/values
        (1, heads, len(context), head_dim) and the next token's logits (1, vocab)."""
        from transformers import DynamicCache

        context = list(req.context)
        n, kept = self._longest_kept(context, req.adapter)
        past: Any = None
        if kept is not None:
            self.prefix_hits += 1
            past = DynamicCache(ddp_cache_data=[(k[None, :, :n], v[None, :, :n]) for k, v in kept.kv])
        device = self.policy.model.device
        logits = None
        for start in range(n, len(context), PREFILL_CHUNK):
            piece = context[start : start + PREFILL_CHUNK]
            out = self.policy.model(
                input_ids=torch.tensor([piece], device=device),
                position_ids=torch.arange(start, start + len(piece), device=device)[None],
                cache=past if past is not None else DynamicCache(),
                use_cache=True,
                logits_to_keep=1,
                **self._route([req.adapter]),
            )
            past = output_cache(out)
            logits = out.logits[:, -1, :]
        assert past is not None and logits is not None
        keys, values = [lay.keys for lay in past.layers], [lay.values for lay in past.layers]
        # kept at once, not only when the row ends: requests arriving together that open the same way (the
        # same system prompt, K rollouts of one task) run their common opening once
        self._keep(context, [(k[0], v[0]) for k, v in zip(keys, values, strict=True)], req.adapter)
        return keys, values, logits

    def _longest_kept(self, context: list[int], adapter: str | None) -> tuple[int, _Kept | None]:
        best, found, key = 0, None, None
        limit = len(context) - 1  # one token at least is fed, for the logits
        for k, kept in self._kept.items():
            if kept.adapter != adapter:
                continue
            n = common_length(kept.tokens, context, limit)
            if n > best:
                best, found, key = n, kept, k
        if found is None or key is None or best < SHARED_MIN_TOKENS:
            return 0, None
        self._kept.move_to_end(key)
        return best, found

    def _keep(self, tokens: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]], adapter: str | None) -> None:
        if self.prefix_cache_tokens <= 0 or len(tokens) > self.prefix_cache_tokens:
            return
        for k, kept in list(self._kept.items()):  # a prefix of the new one is superseded by it
            n = len(kept.tokens)
            if kept.adapter == adapter and n <= len(tokens) and tokens[:n] == kept.tokens:
                self._forget(k)
        self._kept_serial += 1
        key = self._kept_serial
        self._kept[key] = _Kept(tokens, kv, adapter)
        self._kept_tokens += len(tokens)
        while self._kept_tokens > self.prefix_cache_tokens:
            self._forget(next(iter(self._kept)))

    def _forget(self, key: int) -> None:
        kept = self._kept.pop(key)
        self._kept_tokens -= len(kept.tokens)

    def _merge(self, joining: list[tuple[_Row, list[torch.Tensor], list[torch.Tensor], torch.Tensor]]) -> None:
        """Add prefilled rows to the batch: the running rows and the new ones, right-aligned in the new width
        (finished rows leave here)."""
        live = [b for b, row in enumerate(self._rows) if not row.done]
        layers = self._cache.layers if live else []
        old = [(self._rows[b], [lay.keys[b] for lay in layers], [lay.values[b] for lay in layers]) for b in live]
        new = [(row, [k[0] for k in keys], [v[0] for v in values]) for row, keys, values, _ in joining]
        logits = [lg for *_, lg in joining]
        if live:
            assert self._logits is not None
            logits = [self._logits[torch.tensor(live, device=self._logits.device)], *logits]
        self._rebuild([*old, *new])
        self._logits = torch.cat(logits)

    def _rebuild(self, rows: list[tuple[_Row, list[torch.Tensor], list[torch.Tensor]]]) -> None:
        """The batch from each row's per-layer keys/values (heads, its width, head_dim), right-aligned in the
        widest, in buffers with room for the tokens the rows may still add (a decode step then writes its
        slot and copies nothing): one copy of each row."""
        from transformers import DynamicCache

        from agentloop.policy.kv import GrowingLayer

        width = max(keys[0].shape[1] for _, keys, _ in rows)
        room = max(1, max(r.req.max_new_tokens - len(r.tokens) for r, _, _ in rows))
        ref = rows[0][1]
        cache = DynamicCache(ddp_cache_data=[(k[None, :, :0], k[None, :, :0]) for k in ref])
        for i, k0 in enumerate(ref):
            H, _, D = k0.shape
            kbuf = k0.new_empty((len(rows), H, width + room, D))
            vbuf = k0.new_empty((len(rows), H, width + room, D))
            for b, (_, keys, values) in enumerate(rows):
                n = keys[i].shape[1]
                kbuf[b, :, : width - n].zero_()  # padding: masked, but never garbage (0 x NaN is NaN)
                vbuf[b, :, : width - n].zero_()
                kbuf[b, :, width - n : width] = keys[i]
                vbuf[b, :, width - n : width] = values[i]
            cache.layers[i] = GrowingLayer.wrap(kbuf, vbuf, width)
        mask = torch.zeros((len(rows), width), dtype=torch.long, device=ref[0].device)
        for b, (row, keys, _) in enumerate(rows):
            old_b = next((j for j, r in enumerate(self._rows) if r is row), None)
            n = keys[0].shape[1]
            if old_b is None:
                mask[b, width - n :] = 1  # a new row: every position is real
            else:
                mask[b, width - n :] = self._mask[old_b, self._mask.shape[1] - n :]
        self._cache, self._mask, self._rows = cache, mask, [r for r, _, _ in rows]

    @torch.inference_mode()
    def _step(self) -> None:
        """Sample a token for every running row and answer the rows that finished; one forward for the batch.
        A finished row's slot is fed padding (as a batch decoded to its end would) until the batch is rebuilt:
        when rows join, or when finished rows outnumber running ones; copying the batch's keys/values at every
        row's end would cost more."""
        assert self._logits is not None
        self.most_adapters = max(self.most_adapters, len(self._running()))
        device = self._logits.device
        temps = torch.tensor([r.req.temperature for r in self._rows], device=device, dtype=torch.float32)
        sampled = temps > 0
        scaled = self._logits.float() / torch.where(sampled, temps, torch.ones_like(temps))[:, None]
        logp = torch.log_softmax(scaled, dim=-1)
        tok = logp.argmax(-1)
        if bool(sampled.any()):
            drawn = torch.multinomial(logp[sampled].exp(), 1, generator=self._generator).squeeze(-1)
            tok[sampled] = drawn
        lps = logp.gather(-1, tok[:, None]).squeeze(-1).tolist()
        toks = tok.tolist()
        stop_ids = self.policy.stop_ids
        for b, row in enumerate(self._rows):
            if row.done:
                continue
            row.tokens.append(toks[b])
            row.logprobs.append(lps[b])
            if toks[b] in stop_ids or len(row.tokens) >= row.req.max_new_tokens:
                self._finish(b, row)
                row.done = True
        self.steps += 1
        live = [b for b, row in enumerate(self._rows) if not row.done]
        if not live:
            self._reset_batch()
            return
        if len(self._rows) - len(live) > len(live):
            self._keep_only(live)
            tok = tok[torch.tensor(live, device=device)]
        done = torch.tensor([row.done for row in self._rows], device=device)
        tok = torch.where(done, torch.full_like(tok, self.policy.pad_id), tok)
        self._mask = torch.cat([self._mask, (~done).long()[:, None]], 1)
        positions = torch.tensor([[len(r.req.context) + len(r.tokens) - 1] for r in self._rows], device=device)
        out = self.policy.model(
            input_ids=tok[:, None],
            attention_mask=self._mask,
            position_ids=positions,
            cache=self._cache,
            use_cache=True,
            **self._route([None if r.done else r.req.adapter for r in self._rows]),
        )
        self._cache = output_cache(out)
        self._logits = out.logits[:, -1, :]

    def _finish(self, b: int, row: _Row) -> None:
        tokens, lps = row.tokens, row.logprobs
        stopped = tokens[-1] in self.policy.stop_ids
        text_ids = tokens[:-1] if stopped else tokens
        gen = Generation(
            list(tokens),
            list(lps),
            "stop" if stopped else "length",
            self.tokenizer.decode(text_ids, skip_special_tokens=True),
        )
        # what the model has seen of this row: its context and every token but the one sampled last
        seen = list(row.req.context) + tokens[:-1]
        keep = self._mask[b].nonzero().squeeze(-1)
        if len(keep) == len(seen):
            layers = self._cache.layers
            kv = [(lay.keys[b].index_select(1, keep), lay.values[b].index_select(1, keep)) for lay in layers]
            self._keep(seen, kv, row.req.adapter)
        if not row.future.done():
            row.future.set_result(gen)

    def _keep_only(self, going: list[int]) -> None:
        """Rebuild the batch with these rows only, cutting the left columns none of them uses."""
        index = torch.tensor(going, device=self._mask.device)
        first = int((self._mask[index].cumsum(1) > 0).float().argmax(1).min())  # the leftmost column still used
        layers = self._cache.layers
        kept = [
            (self._rows[b], [lay.keys[b, :, first:] for lay in layers], [lay.values[b, :, first:] for lay in layers])
            for b in going
        ]
        assert self._logits is not None
        logits = self._logits.index_select(0, index)
        self._rebuild(kept)
        self._logits = logits

    def _reset_batch(self) -> None:
        self._rows, self._cache, self._logits, self._joining = [], None, None, set()
        self._mask = torch.zeros((0, 0), dtype=torch.long)

    def _running(self) -> set[str | None]:
        return {r.req.adapter for r in self._live()}

    def _live(self) -> list[_Row]:
        return [r for r in self._rows if not r.done]
