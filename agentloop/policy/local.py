"""Local inference with transformers (+ PEFT adapters): batched sampling that returns the exact
token ids and their log-probs.

The decode loop is our own (prefill with left padding, then one token per step with the KV cache)
so that each sampled token's log-prob under the sampling distribution is taken as it is drawn,
without keeping (steps, batch, vocab) logits around as `generate(output_logits=True)` would.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from agentloop.policy.base import Generation, GenerationRequest
from agentloop.policy.models import load_model_and_tokenizer, resolve_model_dir
from agentloop.settings import Settings

log = logging.getLogger(__name__)


class LocalPolicy:
    """A transformers model in this process; adapters are PEFT LoRA directories loaded by name."""

    def __init__(
        self, model: Any, tokenizer: Any, name: str, max_batch_size: int = 16, seed: int | None = None
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.max_batch_size = max_batch_size
        self._lock = threading.Lock()
        self._adapters: set[str] = set()
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
        model_dir = resolve_model_dir(settings.model, settings.models_dir)
        model, tokenizer = load_model_and_tokenizer(model_dir, settings.model_dtype, settings.device)
        return cls(model, tokenizer, name=settings.model, max_batch_size=settings.max_batch_size)

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
        results: list[Generation | None] = [None] * len(requests)
        groups: dict[tuple[str | None, float], list[int]] = defaultdict(list)
        for i, req in enumerate(requests):
            if req.adapter is not None and req.adapter not in self._adapters:
                raise KeyError(f"adapter {req.adapter!r} is not loaded (loaded: {sorted(self._adapters)})")
            groups[(req.adapter, req.temperature)].append(i)
        with self._lock:
            for (adapter, temperature), idx in groups.items():
                for start in range(0, len(idx), self.max_batch_size):
                    chunk = idx[start : start + self.max_batch_size]
                    outs = self._sample([requests[i] for i in chunk], adapter, temperature)
                    for i, out in zip(chunk, outs, strict=True):
                        results[i] = out
        return [r for r in results if r is not None]

    @torch.inference_mode()
    def _sample(self, reqs: list[GenerationRequest], adapter: str | None, temperature: float) -> list[Generation]:
        model = self.model
        if self._adapters:
            if adapter is None:
                with model.disable_adapter():
                    return self._decode(reqs, temperature)
            model.set_adapter(adapter)
        return self._decode(reqs, temperature)

    def _decode(self, reqs: list[GenerationRequest], temperature: float) -> list[Generation]:
        device = self.model.device
        B = len(reqs)
        lengths = [len(r.context) for r in reqs]
        if min(lengths) == 0:
            raise ValueError("cannot generate from an empty context")
        width = max(lengths)
        max_new = max(r.max_new_tokens for r in reqs)
        ids = torch.full((B, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((B, width), dtype=torch.long)
        for b, r in enumerate(reqs):  # left padding: every sequence ends at the same column
            ids[b, width - lengths[b] :] = torch.tensor(list(r.context), dtype=torch.long)
            mask[b, width - lengths[b] :] = 1
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, T)

        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
        cache = out.cache if hasattr(out, "cache") else out.past_key_values
        logits = out.logits[:, -1, :]  # (B, V)
        next_pos = positions[:, -1:] + 1  # (B, 1)

        tokens = torch.empty((B, max_new), dtype=torch.long, device=device)
        logprobs = torch.zeros((B, max_new), dtype=torch.float32, device=device)
        done = torch.zeros(B, dtype=torch.bool, device=device)
        stop = torch.tensor(sorted(self.stop_ids), device=device)
        limits = torch.tensor([r.max_new_tokens for r in reqs], device=device)
        steps = 0
        for t in range(max_new):
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
                input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos, cache=cache, use_cache=True
            )
            cache = out.cache if hasattr(out, "cache") else out.past_key_values
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
        return gens
