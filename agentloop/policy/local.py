"""Local inference with transformers (+ PEFT adapters): batched sampling that returns the exact
token ids and their log-probs.

The decode loop is our own (prefill with left padding, then one token per step with the KV cache)
so that each sampled token's log-prob under the sampling distribution is taken as it is drawn,
without keeping (steps, batch, vocab) logits around as `generate(output_logits=True)` would.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentloop.policy import mixed_lora
from agentloop.policy.base import Generation, GenerationRequest
from agentloop.policy.coalesce import Coalescer
from agentloop.policy.models import load_model_and_tokenizer, output_cache, resolve_model_dir
from agentloop.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class _Prefix:
    """Keys/values an episode's last turn left behind: per layer (heads, tokens, head_dim)."""

    tokens: list[int]
    kv: list[tuple[torch.Tensor, torch.Tensor]]
    adapter: str | None


SHARED_MIN_TOKENS = 16  # a shorter common opening is not worth stacking a cache for
PREFILL_TOKENS = 4096  # new tokens per prefill forward: longer batches are prefilled a few rows at a time


def common_length(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    for i in range(n):
        if a[i] != b[i]:
            return i
    return max(n, 0)


def repeat_rows(cache: Any, index: torch.Tensor) -> Any:
    """A batch cache whose row b is row index[b] of `cache`."""
    from transformers import DynamicCache

    return DynamicCache(
        ddp_cache_data=[(lay.keys.index_select(0, index), lay.values.index_select(0, index)) for lay in cache.layers]
    )


class LocalPolicy:
    """A transformers model in this process; adapters are PEFT LoRA directories loaded by name.

    Keys/values of each episode's context are kept between its turns (by request key), so a turn
    only runs the model over the tokens added since the last one, as prefix-caching servers do; the
    opening new episodes share is run once, and so is a context several rows of one batch repeat."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        name: str,
        max_batch_size: int = 16,
        seed: int | None = None,
        max_cached_episodes: int = 64,
        max_batch_tokens: int = 65536,
        mixed_adapter_batches: bool = True,
        batch_window_s: float = 0.02,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        # rows on different adapters decode in one forward (PEFT routes each row through its own LoRA
        # weights, the base weights run once for all); False: one batch per adapter, one after another
        self.mixed_adapter_batches = mixed_adapter_batches
        self.stacked_lora = True  # False: PEFT's own mixed batch (per adapter in every layer), to compare
        self._mixed: mixed_lora.MixedLora | None = None  # while a batch of rows on different adapters decodes
        self._lock = threading.Lock()
        # calls other threads make while a batch decodes (a worker's concurrent episodes) join the next one
        self._coalesce: Coalescer[GenerationRequest, Generation] = Coalescer(self._generate, batch_window_s)
        self._adapters: set[str] = set()
        self._prefixes: OrderedDict[str, _Prefix] = OrderedDict()
        self._shared: dict[str | None, _Prefix] = {}  # per adapter: the latest kept prefix, for new episodes
        self.max_cached_episodes = max_cached_episodes
        self._generator = torch.Generator(device=model.device)
        if seed is not None:
            self._generator.manual_seed(seed)
        else:
            self._generator.seed()
        eos = tokenizer.eos_token_id
        self.stop_ids = {int(e) for e in (eos if isinstance(eos, list) else [eos])}
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.stop_ids)))

    @classmethod
    def from_settings(cls, settings: Settings) -> LocalPolicy:
        if settings.torch_threads:
            torch.set_num_threads(settings.torch_threads)
        started = time.monotonic()
        model_dir = resolve_model_dir(settings.model, settings.models_dir)
        model, tokenizer = load_model_and_tokenizer(model_dir, settings.model_dtype, settings.device)
        log.info(
            "policy model ready: %s on %s (%s), loaded in %.1f s",
            settings.model_name,
            model.device,
            settings.model_dtype,
            time.monotonic() - started,
        )
        return cls(
            model,
            tokenizer,
            name=settings.model_name,
            max_batch_size=settings.max_batch_size,
            max_batch_tokens=settings.max_batch_tokens,
            mixed_adapter_batches=settings.mixed_adapter_batches,
            batch_window_s=settings.batch_window_ms / 1000,
        )

    # --- adapters --------------------------------------------------------------------------
    def load_adapter(self, name: str, path: str) -> None:
        from peft import PeftModel

        with self._lock:
            if name in self._adapters:
                return
            if not Path(path, "adapter_config.json").exists():
                raise FileNotFoundError(f"adapter {name!r}: no adapter_config.json in {path}")
            if isinstance(self.model, PeftModel):
                self.model.load_adapter(path, adapter_name=name)
            else:
                self.model = PeftModel.from_pretrained(self.model, path, adapter_name=name)
            self.model.eval()
            self._adapters.add(name)
            log.info("loaded adapter %s from %s", name, path)

    def unload_adapter(self, name: str) -> None:
        with self._lock:
            if name not in self._adapters:
                return
            self._adapters.discard(name)
            self._shared.pop(name, None)
            if self._adapters:
                if self.model.active_adapter == name:
                    self.model.set_adapter(next(iter(self._adapters)))
                self.model.delete_adapter(name)
            else:
                self.model = self.model.unload()  # drop the LoRA layers, keep the base weights as they were
            log.info("unloaded adapter %s", name)

    def loaded_adapters(self) -> set[str]:
        return set(self._adapters)

    # --- sampling --------------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        for req in requests:
            if req.adapter is not None and req.adapter not in self._adapters:
                raise KeyError(f"adapter {req.adapter!r} is not loaded (loaded: {sorted(self._adapters)})")
        return self._coalesce(requests)

    @property
    def batches_merged(self) -> tuple[int, int]:
        """(batches run, of them those that held several threads' calls)."""
        return self._coalesce.batches, self._coalesce.merged

    def _generate(self, requests: list[GenerationRequest]) -> list[Generation]:
        results: list[Generation | None] = [None] * len(requests)
        groups: dict[tuple[str | None, float], list[int]] = defaultdict(list)
        for i, req in enumerate(requests):
            groups[(None if self.mixed_adapter_batches else req.adapter, req.temperature)].append(i)
        with self._lock:
            for (_, temperature), idx in groups.items():
                for chunk in self._batches(requests, idx):
                    outs = self._sample([requests[i] for i in chunk], temperature)
                    for i, out in zip(chunk, outs, strict=True):
                        results[i] = out
        return [r for r in results if r is not None]

    def _batches(self, requests: Sequence[GenerationRequest], idx: list[int]) -> list[list[int]]:
        """`idx` (indices into `requests`) cut, in order, into batches of at most `max_batch_size` rows whose
        padded width (longest context + most new tokens) times rows stays within `max_batch_tokens`: the
        decode cache of a batch is rows x width tokens of keys/values (46 KB a token for SmolLM2-135M, so
        16 rows of 8k tokens would be 6 GB, held several times over during a call). A row wider than the
        budget decodes alone."""
        batches: list[list[int]] = []
        width = 0
        for i in idx:
            row = len(requests[i].context) + requests[i].max_new_tokens
            if batches and len(batches[-1]) < self.max_batch_size:
                wider = max(width, row)
                if wider * (len(batches[-1]) + 1) <= self.max_batch_tokens:
                    batches[-1].append(i)
                    width = wider
                    continue
            batches.append([i])
            width = row
        return batches

    @torch.inference_mode()
    def _sample(self, reqs: list[GenerationRequest], temperature: float) -> list[Generation]:
        adapters = [r.adapter for r in reqs]
        model = self.model
        if self._adapters and len(set(adapters)) == 1:  # one adapter: select it (or none) for the whole model
            if adapters[0] is None:
                with model.disable_adapter():
                    return self._decode(reqs, temperature, adapters)
            model.set_adapter(adapters[0])
        elif self._adapters:  # rows on different adapters: stacked LoRA terms (mixed_lora.py), else PEFT's
            present = [a for a in set(adapters) if a is not None]
            if self.stacked_lora and mixed_lora.supported(model, present):
                with mixed_lora.MixedLora(model, adapters) as self._mixed:
                    try:
                        return self._decode(reqs, temperature, adapters)
                    finally:
                        self._mixed = None
        return self._decode(reqs, temperature, adapters)

    def _routing(self, adapters: Sequence[str | None]) -> dict[str, Any]:
        """What the next forward needs to send each of its rows through the row's own adapter, when the rows'
        adapters differ: the stacked LoRA terms routed (no argument), or PEFT's mixed-adapter batch
        (`adapter_names`, `__base__`: none). Nothing when they are all the same."""
        if self._mixed is not None:
            self._mixed.route(adapters)
            return {}
        if len(set(adapters)) <= 1:
            return {}
        return {"adapter_names": [a if a is not None else "__base__" for a in adapters]}

    def _reusable(self, req: GenerationRequest, adapter: str | None) -> tuple[int, _Prefix | None]:
        """How many leading tokens of the context already have keys/values cached: the episode's own
        (its earlier turns), else those of the last episode whose context opens the same way (every
        episode starts with the same system prompt and worked example)."""
        prefix = self._prefixes.get(req.key) if req.key is not None else None
        if prefix is not None and prefix.adapter == adapter:
            usable = min(len(prefix.tokens), len(req.context) - 1)  # at least one token must be fed
            if usable > 0 and list(req.context[:usable]) == prefix.tokens[:usable]:
                return usable, prefix
        shared = self._shared.get(adapter)
        if shared is not None:
            usable = common_length(shared.tokens, req.context, len(req.context) - 1)
            if usable >= SHARED_MIN_TOKENS:
                return usable, shared
        return 0, None

    def _decode(
        self, reqs: list[GenerationRequest], temperature: float, adapters: list[str | None]
    ) -> list[Generation]:
        """Sample the rows, row b on `adapters[b]` (the model is set to it already when all are the same)."""
        device = self.model.device
        B = len(reqs)
        if min(len(r.context) for r in reqs) == 0:
            raise ValueError("cannot generate from an empty context")
        # rows with the same context on the same adapter (M samples at one prefix, the first turns of K
        # rollouts of a task) are prefilled once: each takes the cache layout of the first such row
        first: dict[tuple[str | None, tuple[int, ...]], int] = {}
        owner = [first.setdefault((adapters[b], tuple(r.context)), b) for b, r in enumerate(reqs)]
        distinct = list(first.values())  # increasing: each context's first row
        reuse = [self._reusable(r, a) for r, a in zip(reqs, adapters, strict=True)]
        primed = False
        for adapter in dict.fromkeys(adapters):
            opening = [reqs[b] for b in distinct if reuse[b][0] == 0 and adapters[b] == adapter]
            primed = self._prime_shared(opening, adapter, mixed=len(set(adapters)) > 1) or primed
        if primed:
            reuse = [self._reusable(r, a) for r, a in zip(reqs, adapters, strict=True)]
        reuse = [reuse[o] for o in owner]
        cached = [n for n, _ in reuse]
        P = max(cached)
        fresh = [list(r.context[n:]) for r, (n, _) in zip(reqs, reuse, strict=True)]
        N = max(len(f) for f in fresh)

        # Layout of each row: [pad][cached prefix][pad][new tokens]; padding is masked out and every real
        # token keeps its true position, so cached rows of different lengths decode together.
        ids = torch.full((B, N), self.pad_id, dtype=torch.long)
        mask = torch.zeros((B, P + N), dtype=torch.long)
        positions = torch.zeros((B, N), dtype=torch.long)
        for b, (n_cached, new) in enumerate(zip(cached, fresh, strict=True)):
            ids[b, N - len(new) :] = torch.tensor(new, dtype=torch.long)
            mask[b, P - n_cached : P] = 1
            mask[b, P + N - len(new) :] = 1
            positions[b, N - len(new) :] = torch.arange(n_cached, n_cached + len(new))
        ids, mask, positions = ids.to(device), mask.to(device), positions.to(device)
        rows = torch.tensor(distinct, device=device)
        past = self._stack_prefixes([reuse[b] for b in distinct], P) if P else None
        for r, (n, prefix) in zip(reqs, reuse, strict=True):  # this call keeps them again, longer: free them now
            if n and r.key is not None and self._prefixes.get(r.key) is prefix:
                del self._prefixes[r.key]
        logits, cache = self._prefill(ids[rows], mask[rows], positions[rows], past, [adapters[b] for b in distinct])
        del past  # the prefill's cache holds its own copy of these keys/values
        if len(distinct) < B:
            slot = {b: k for k, b in enumerate(distinct)}
            back = torch.tensor([slot[o] for o in owner], device=device)
            logits, cache = logits[back], repeat_rows(cache, back)
        next_pos = torch.tensor([[len(r.context)] for r in reqs], device=device)  # (B, 1)
        from agentloop.policy.kv import with_room

        longest = max(r.max_new_tokens for r in reqs)
        cache = with_room(cache, longest)  # a step writes its slot, copies nothing
        tokens = torch.empty((B, longest), dtype=torch.long, device=device)
        logprobs = torch.zeros(tokens.shape, dtype=torch.float32, device=device)
        done = torch.zeros(B, dtype=torch.bool, device=device)
        stop = torch.tensor(sorted(self.stop_ids), device=device)
        limits = torch.tensor([r.max_new_tokens for r in reqs], device=device)
        steps = 0
        for t in range(tokens.shape[1]):
            scaled = logits.float() / temperature if temperature > 0 else logits.float()
            logp = torch.log_softmax(scaled, dim=-1)  # (B, V): the distribution we sample from
            if temperature > 0:
                tok = torch.multinomial(logp.exp(), 1, generator=self._generator).squeeze(-1)
            else:
                tok = logp.argmax(-1)
            tok = torch.where(done, torch.full_like(tok, self.pad_id), tok)
            tokens[:, t] = tok
            logprobs[:, t] = logp.gather(-1, tok[:, None]).squeeze(-1)
            steps = t + 1
            done = done | torch.isin(tok, stop) | (limits <= t + 1)
            if bool(done.all()):
                break
            mask = torch.cat([mask, torch.ones((B, 1), dtype=mask.dtype, device=device)], dim=-1)
            out = self.model(
                input_ids=tok[:, None],
                attention_mask=mask,
                position_ids=next_pos,
                cache=cache,
                use_cache=True,
                **self._routing(adapters),
            )
            cache = output_cache(out)
            logits = out.logits[:, -1, :]
            next_pos = next_pos + 1

        gens = []
        tok_rows = tokens[:, :steps].tolist()
        lp_rows = logprobs[:, :steps].tolist()
        for b, r in enumerate(reqs):
            row, lps = tok_rows[b], lp_rows[b]
            n = min(r.max_new_tokens, len(row))
            finish = "length"
            for j in range(n):
                if row[j] in self.stop_ids:
                    n, finish = j + 1, "stop"
                    break
            row, lps = row[:n], lps[:n]
            text_ids = row[:-1] if finish == "stop" else row
            gens.append(Generation(row, lps, finish, self.tokenizer.decode(text_ids, skip_special_tokens=True)))
        self._keep_prefixes(reqs, gens, cache, mask, fed=steps - 1, adapters=adapters)
        return gens

    def _prefill(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, past: Any, adapters: list[str | None]
    ) -> tuple[Any, Any]:
        """The batch's new tokens through the model, a few rows at a time (at most PREFILL_TOKENS new tokens
        per forward): one forward over many long rows materialises attention scores of rows x new x all
        tokens at once (gigabytes for 16 rows of 2-3k tokens), where a few rows at a time need a fraction.
        Returns the last position's logits (B, V) and the whole batch's cache."""
        from transformers import DynamicCache

        B, N = ids.shape
        rows = max(1, PREFILL_TOKENS // max(N, 1))
        parts = [slice(start, start + rows) for start in range(0, B, rows)]
        outs = []
        for part in parts:
            part_past = past
            if past is not None and len(parts) > 1:
                part_past = DynamicCache(ddp_cache_data=[(lay.keys[part], lay.values[part]) for lay in past.layers])
            outs.append(
                self.model(
                    input_ids=ids[part],
                    attention_mask=mask[part],
                    position_ids=positions[part],
                    cache=part_past,
                    use_cache=True,
                    logits_to_keep=1,
                    **self._routing(adapters[part]),
                )
            )
        logits = torch.cat([out.logits[:, -1, :] for out in outs])
        if len(outs) == 1:
            return logits, output_cache(outs[0])
        layers = [output_cache(out).layers for out in outs]
        merged = [
            (torch.cat([lays[i].keys for lays in layers]), torch.cat([lays[i].values for lays in layers]))
            for i in range(len(layers[0]))
        ]
        return logits, DynamicCache(ddp_cache_data=merged)

    def _prime_shared(self, new: list[GenerationRequest], adapter: str | None, mixed: bool = False) -> bool:
        """Several new episodes on one adapter that open the same way (rollouts of one task, a batch of tasks):
        run the model once over their common opening and share its keys/values, instead of once per row.
        `mixed`: the model is not set to `adapter` (the batch mixes adapters), so the row is routed to it."""
        if len(new) < 2 or self.max_cached_episodes <= 0:
            return False
        common = len(new[0].context) - 1
        for r in new[1:]:
            common = common_length(new[0].context, r.context, min(common, len(r.context) - 1))
        if common < SHARED_MIN_TOKENS:
            return False
        opening = list(new[0].context[:common])
        ids = torch.tensor([opening], dtype=torch.long, device=self.model.device)
        route: dict[str, Any] = {}
        if mixed and self._mixed is not None:
            self._mixed.route([adapter])
        elif mixed:
            route = {"adapter_names": [adapter if adapter is not None else "__base__"]}
        out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **route)
        cache = output_cache(out)
        kv = [(layer.keys[0], layer.values[0]) for layer in cache.layers]
        self._shared[adapter] = _Prefix(opening, kv, adapter)
        return True

    def _stack_prefixes(self, reuse: list[tuple[int, _Prefix | None]], width: int) -> Any:
        """One batch cache from the rows' cached keys/values, left-padded to `width`."""
        from transformers import DynamicCache

        layers = []
        for layer in range(len(next(p for _, p in reuse if p is not None).kv)):
            ref_k = next(p for _, p in reuse if p is not None).kv[layer][0]
            H, _, D = ref_k.shape
            keys = ref_k.new_zeros((len(reuse), H, width, D))
            values = ref_k.new_zeros((len(reuse), H, width, D))
            for b, (n, prefix) in enumerate(reuse):
                if prefix is not None and n:
                    keys[b, :, width - n :] = prefix.kv[layer][0][:, :n]
                    values[b, :, width - n :] = prefix.kv[layer][1][:, :n]
            layers.append((keys, values))
        return DynamicCache(ddp_cache_data=layers)

    def _keep_prefixes(
        self,
        reqs: list[GenerationRequest],
        gens: list[Generation],
        cache: Any,
        mask: torch.Tensor,
        fed: int,
        adapters: list[str | None],
    ) -> None:
        """Keep each episode's keys/values (its context and the generated tokens the model has seen), so
        its next turn only feeds the new tokens."""
        if self.max_cached_episodes <= 0:
            return
        for b, (req, gen) in enumerate(zip(reqs, gens, strict=True)):
            if req.key is None:
                continue
            seen = list(req.context) + gen.token_ids[: min(len(gen.token_ids), fed)]
            keep = mask[b].nonzero().squeeze(-1)[: len(seen)]
            kv = [
                (layer.keys[b].index_select(1, keep), layer.values[b].index_select(1, keep)) for layer in cache.layers
            ]
            self._prefixes[req.key] = self._shared[adapters[b]] = _Prefix(seen, kv, adapters[b])
            self._prefixes.move_to_end(req.key)
        while len(self._prefixes) > self.max_cached_episodes:
            self._prefixes.popitem(last=False)

    def end_episode(self, key: str) -> None:
        """Forget an episode's cached keys/values."""
        self._coalesce.forget()
        with self._lock:
            self._prefixes.pop(key, None)

    def clear_cache(self) -> None:
        """Forget every cached prefix (the weights under them changed, e.g. after a training step)."""
        with self._lock:
            self._prefixes.clear()
            self._shared.clear()
