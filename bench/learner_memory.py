"""Learner memory and speed: one policy update on the same model and the same batch of synthetic rollouts,
done five ways, each in fresh processes, plus the memory of chunked token log-probs.

    pip install -e '.[bench]'        # TRL, for the GRPOTrainer comparison
    python bench/learner_memory.py [--quick] [--json] [--write-docs] [--model smollm2-135m-instruct|DIR|random]

The batch: N rollouts of T tokens (random ids), in groups of K from the same prompt; after the prompt,
agent turns alternate with observations and the agent's tokens are about half of each rollout; rewards
are random, advantages leave-one-out; the sampler's log-probs are the model's own (the fresh LoRA adapter
is the identity), so pi_old needs no extra forward in any configuration. Every configuration uses the
same LoRA (r 16, alpha 32 on q,k,v,o,gate,up,down, seeded the same), AdamW (lr 5e-5, weight decay 0.01),
grad-norm clip 1.0, fp32, no activation checkpointing (but in loop_ckpt), and micro-batches of M
rollouts accumulated into one optimizer step over the whole batch. What is timed, per update:

  loop  agentloop's `update()` (LoopConfig, one epoch, one minibatch = the batch): collate, chunked
        log-probs over the agent's tokens, clipped loss, backward per micro-batch, grad clip, AdamW step.
        One model in memory; no value network; no reference.
  sft   -mean log p(agent tokens) per rollout, averaged over rollouts (agentloop's supervised loss), with
        the same log-prob code, micro-batching and optimizer: the same loop minus the RL terms.
  ppo   classic PPO for LLMs, minimal: a frozen reference copy of the base (its KL in the per-token reward),
        a value model (a second copy of the base with its own LoRA and a scalar head), per-token GAE over
        the agent's tokens, whitened advantages, clipped policy and value losses (TRL's former PPOConfig
        defaults: KL 0.05, clip 0.2, value clip 0.2, value coef 0.1, gamma 1, lambda 0.95). Timed: reference
        log-probs and old values (no grad), GAE, then the policy + value forward/backward and the step.
  trl   TRL's GRPOTrainer set to LOOP's objective: beta 0 (no reference model), scale_rewards "none",
        loss_type "grpo" (each sequence's token mean, then the mean over sequences: LOOP's
        L = mean_r mean_t), token-level ratios clipped to [1/(1+eps), 1+eps], num_iterations 1, the same
        LoRA as peft_config, bf16 and gradient checkpointing off (GRPOConfig turns both on by default).
        Generation is skipped: a subclass returns prepared batches from `_prepare_inputs` (prompt_ids,
        completion_ids, masks, tool_mask = agent tokens, advantages, old_per_token_logps = the sampler's).
        Timed: `GRPOTrainer.training_step` on each micro-batch (TRL's `_compute_loss` with its fused LM
        head, and the backward), then grad clip and the optimizer step, as `Trainer.train` does.
  loop_ckpt  loop with LoopConfig(activation_checkpointing=True): each decoder layer recomputed in backward
        (rows run whole: the shared-opening forward needs the layers' caches, which a replay would drop).

tokens/s: the batch's tokens (N x T; every position goes through forward and backward) / seconds of one
update, median over repeats after a warm-up update on one micro-batch. One torch thread per process by
default (--threads): the ratios are the point, and multi-threaded CPU timings swing several-fold when other
work shares the cores (on 2 busy cores, the same LOOP update ran at 5 to 30 tokens/s with 2 threads, 142 with 1).
Memory (Linux): each configuration runs again in a process of its own (warm-up, then one update) with
glibc's mmap threshold fixed at 128 KiB (MALLOC_MMAP_THRESHOLD_), so that freed tensors leave the RSS.
Every process first imports the same libraries and loads the same model (its weights read in), batch
and 4k-token input; then its peak RSS is reset (/proc/self/clear_refs) and the configuration runs. Its
increment = the peak RSS from there on - the RSS at that point: the memory the configuration adds, run
after run to the MB (a peak that includes loading moves with page-cache and allocator state by up to
a few hundred MB). The *_mem_ratio keys are ratios of increments; the absolute peaks (ru_maxrss, loading
included) are reported too, and the timing processes' with the default allocator.
logprob_mem_ratio: the same increment for `sequence_logprobs` (chunked) / a full
`log_softmax(logits.float())` gather, forward only under no_grad, over every position of one sequence.

Last line: a JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from agentloop.learner.config import LoopConfig

from report import emit, machine, write_section

UPDATES = ("loop", "sft", "ppo", "trl", "loop_ckpt")
CHILDREN = (*UPDATES, "logprob_chunked", "logprob_naive")
# Memory processes: glibc maps every allocation of 128 KiB or more and unmaps it when freed, so peak RSS
# follows the peak of live memory. By default the threshold moves and freed memory is kept for reuse:
# peaks then depend on the order of allocations (several % from run to run, and well above live memory).
MEMORY_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}
TARGETS = {  # the product spec's targets, reported as met or missed (never tuned for)
    "loop_sft_mem_ratio": ("<=", 1.10),
    "loop_sft_tps_ratio": (">=", 0.8),
    "loop_trl_tps_ratio": (">=", 1.0),
    "loop_trl_mem_ratio": ("<=", 1.0),
    "logprob_mem_ratio": ("<=", 0.25),
}


def log(msg: str) -> None:
    print(f"[learner_memory] {msg}", file=sys.stderr, flush=True)


# --- the model ------------------------------------------------------------------------------------


def random_model_dir(target: Path) -> Path:
    """A randomly initialised Llama of SmolLM2-135M's shape, with a plain word-level tokenizer (the
    comparison needs token ids and special ids, not text)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    vocab = {tok: i for i, tok in enumerate(specials + [f"t{i}" for i in range(49152 - len(specials))])}
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<unk>")),
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="</s>",
    )
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(target)
    tok.save_pretrained(target)
    return target


def resolve_model(name: str | None, scratch: Path) -> tuple[Path, str]:
    """(directory, label): the real default model when it is available, else a random one of its shape."""
    from agentloop.policy.models import ModelNotFound, resolve_model_dir
    from agentloop.settings import get_settings

    settings = get_settings()
    label = "random llama of SmolLM2-135M's shape"
    if name != "random":
        try:
            path = resolve_model_dir(name or settings.model, settings.models_dir)
            return path, path.name
        except ModelNotFound as exc:
            log(f"{exc}; falling back to a {label}")
            label += " (the real weights are unavailable)"
    return random_model_dir(scratch / "random-llama"), label


def load_model(model_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    with torch.no_grad():  # the weights are mapped from the file: read them all so they count in RSS from here
        for p in model.parameters():
            p.sum()
    return model, AutoTokenizer.from_pretrained(model_dir)


def pad_id_of(tokenizer: Any) -> int:
    return int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)


# --- the batch ------------------------------------------------------------------------------------


def segment_lengths(total: int, parts: int, rng: random.Random) -> list[int]:
    """`parts` positive lengths summing to `total`, each within about 25% of the mean."""
    if parts == 0:
        return []
    weights = [rng.uniform(0.75, 1.25) for _ in range(parts)]
    lengths = [max(1, int(total * w / sum(weights))) for w in weights]
    lengths[-1] += total - sum(lengths)
    return lengths


@torch.no_grad()
def make_batch(model: Any, n: int, group: int, length: int, turns: int, micro: int, seed: int) -> dict[str, Any]:
    """Synthetic rollouts as tensors (B, T): ids, agent mask, turn ids, the sampler's log-probs (full
    length, position t = log p(token t | tokens < t)), rewards and leave-one-out advantages."""
    from agentloop.learner.loop import leave_one_out_advantages, sequence_logprobs

    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    prompt = max(8, length // 8)
    ids = torch.randint(0, vocab, (n, length), generator=gen)
    agent = torch.zeros((n, length), dtype=torch.long)
    turn_ids = torch.full((n, length), -1, dtype=torch.long)
    for b in range(n):
        ids[b, :prompt] = ids[b - b % group, :prompt]  # a group's rollouts start from the same prompt
        agent_total = length // 2
        acts = segment_lengths(agent_total, turns, rng)
        obs = [*segment_lengths(length - prompt - agent_total, turns - 1, rng), 0]
        pos = prompt
        for t, (a, o) in enumerate(zip(acts, obs, strict=True)):
            agent[b, pos : pos + a] = 1
            turn_ids[b, pos : pos + a] = t
            pos += a + o
    attn = torch.ones_like(ids)
    logps = torch.zeros((n, length))
    for s in range(0, n, micro):
        target = agent[s : s + micro, 1:].float()
        logps[s : s + micro, 1:] = sequence_logprobs(model, ids[s : s + micro], attn[s : s + micro], target_mask=target)
    rewards = torch.rand((n // group, group), generator=gen)
    return {
        "input_ids": ids,
        "agent_mask": agent,
        "turn_ids": turn_ids,
        "sampler_logprobs": logps,
        "rewards": rewards.flatten(),
        "advantages": leave_one_out_advantages(rewards).flatten(),
        "prompt_len": prompt,
        "group": group,
    }


def to_rollouts(batch: dict[str, Any]) -> list[Any]:
    from agentloop.learner.rollouts import Rollout

    return [
        Rollout(
            task_ref=f"task{b // batch['group']}",
            token_ids=batch["input_ids"][b].tolist(),
            agent_mask=batch["agent_mask"][b].tolist(),
            turn_ids=batch["turn_ids"][b].tolist(),
            sampler_logprobs=batch["sampler_logprobs"][b].tolist(),
            reward=float(batch["rewards"][b]),
            success=False,
        )
        for b in range(batch["input_ids"].shape[0])
    ]


def micro_batches(items: Sequence[int], size: int) -> list[list[int]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


# --- child processes: one configuration each --------------------------------------------------------


def reset_peak() -> None:
    """Set the process's peak RSS (VmHWM, which ru_maxrss reads) to its current RSS."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError as exc:
        raise SystemExit(
            f"bench/learner_memory.py measures memory through /proc/self/clear_refs (Linux): {exc}"
        ) from exc


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def rss_mb() -> float:
    """Resident memory now (VmRSS)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Child:
    """What every child shares: the same imports, model, batch and long input, then one configuration."""

    def __init__(self, spec: dict[str, Any]) -> None:
        # every child imports the same libraries, so every configuration starts from the same state
        import accelerate  # noqa: F401
        import peft  # noqa: F401
        import transformers  # noqa: F401
        from trl import GRPOConfig, GRPOTrainer  # noqa: F401

        import agentloop.learner.update  # noqa: F401

        torch.set_num_threads(spec["threads"])
        self.spec = spec
        self.model_dir = Path(spec["model_dir"])
        self.model, self.tokenizer = load_model(self.model_dir)
        self.pad_id = pad_id_of(self.tokenizer)
        self.batch: dict[str, Any] = torch.load(spec["batch"], weights_only=False)
        self.long_ids: torch.Tensor = self.batch.pop("long_ids")
        self.rollouts = to_rollouts(self.batch)
        self.n = len(self.rollouts)
        self.micro = spec["micro_batch"]

    def loop_config(self, **overrides: Any) -> LoopConfig:
        return LoopConfig(epochs=1, minibatch_size=self.n, micro_batch_size=self.micro, **overrides)

    def lora(self, base: Any, config: LoopConfig | None = None) -> Any:
        from agentloop.learner.model import lora_model

        torch.manual_seed(0)  # the same adapter initialisation in every configuration
        return lora_model(base, config or self.loop_config(), None)

    def timed(self, step: Callable[[list[int]], float]) -> dict[str, Any]:
        """A warm-up update on one micro-batch, then `repeats` updates on the whole batch (one in a memory
        process: the optimizer state exists after the warm-up, and every update peaks alike)."""
        everything = list(range(self.n))
        t0 = time.perf_counter()
        step(everything[: self.micro])
        warmup_s = time.perf_counter() - t0
        loaded = rss_mb()
        seconds, cpu_seconds, grad_norms = [], [], []
        for _ in range(1 if self.spec["mode"] == "memory" else self.spec["repeats"]):
            t0, c0 = time.perf_counter(), time.process_time()
            grad_norms.append(step(everything))
            seconds.append(time.perf_counter() - t0)
            cpu_seconds.append(time.process_time() - c0)
        tokens = int(self.batch["input_ids"].numel())
        return {
            "tokens": tokens,
            "seconds": [round(s, 3) for s in seconds],
            "tokens_per_s": tokens / statistics.median(seconds),
            # CPU time: with one thread, the update's own cost, whatever share of the core other work takes
            "tokens_per_cpu_s": tokens / statistics.median(cpu_seconds),
            "grad_norm_first": grad_norms[0],
            "rss_after_warmup_mb": loaded,
            "warmup_s": round(warmup_s, 3),
        }

    # --- configurations

    def loop(self, **overrides: Any) -> dict[str, Any]:
        from accelerate import Accelerator

        from agentloop.learner.update import LogprobModel, update

        config = self.loop_config(**overrides)
        model = self.lora(self.model, config)
        module = LogprobModel(model, config.logprob_chunk)
        accelerator = Accelerator(cpu=True)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = accelerator.prepare(torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay))
        advantages = self.batch["advantages"].tolist()

        def step(idx: list[int]) -> float:
            rollouts = [self.rollouts[i] for i in idx]
            advs = [advantages[i] for i in idx]
            metrics = update(
                module, optimizer, accelerator, rollouts, advs, None, config, self.pad_id, random.Random(0)
            )
            return float(metrics["loss/grad_norm"])

        return self.timed(step)

    def loop_ckpt(self) -> dict[str, Any]:
        return self.loop(activation_checkpointing=True)

    def sft(self) -> dict[str, Any]:
        from agentloop.learner.loop import sequence_logprobs
        from agentloop.learner.update import collate

        config = self.loop_config()
        model = self.lora(self.model)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)

        def step(idx: list[int]) -> float:
            model.train()
            optimizer.zero_grad(set_to_none=True)
            for micro in micro_batches(idx, self.micro):
                batch = collate([self.rollouts[i] for i in micro], self.pad_id)
                mask = batch.agent_mask  # (B, T-1)
                logp = sequence_logprobs(
                    model, batch.input_ids, batch.attention_mask, config.logprob_chunk, target_mask=mask
                )
                loss = -((logp * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)).mean()
                (loss * len(micro) / len(idx)).backward()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm))
            optimizer.step()
            return grad_norm

        return self.timed(step)

    def ppo(self) -> dict[str, Any]:
        from agentloop.learner.loop import sequence_logprobs
        from agentloop.learner.update import collate

        kl_coef, clip, value_clip, value_coef, gamma, lam = 0.05, 0.2, 0.2, 0.1, 1.0, 0.95
        config = self.loop_config()
        policy = self.lora(self.model)
        reference, _ = load_model(self.model_dir)  # a frozen copy of the base
        for p in reference.parameters():
            p.requires_grad_(False)
        value_base, _ = load_model(self.model_dir)
        value_model = self.lora(value_base)
        value_head = torch.nn.Linear(value_base.config.hidden_size, 1)
        params = [
            p for p in (*policy.parameters(), *value_model.parameters(), *value_head.parameters()) if p.requires_grad
        ]
        optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
        rewards = self.batch["rewards"]

        def values(batch: Any) -> torch.Tensor:
            hidden = value_model.get_decoder()(
                input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
            ).last_hidden_state[:, :-1]  # (B, T-1, H): the state before each target token
            return value_head(hidden).squeeze(-1)  # (B, T-1)

        def step(idx: list[int]) -> float:
            # experience: reference log-probs and old values, then per-token rewards and GAE
            experience = []
            with torch.no_grad():
                for micro in micro_batches(idx, self.micro):
                    batch = collate([self.rollouts[i] for i in micro], self.pad_id)
                    mask = batch.agent_mask
                    ref = sequence_logprobs(
                        reference, batch.input_ids, batch.attention_mask, config.logprob_chunk, target_mask=mask
                    )
                    old_values = values(batch)
                    reward = -kl_coef * (batch.sampler_logprobs - ref) * mask  # (B, T-1)
                    last = mask.shape[1] - 1 - mask.flip(1).argmax(dim=1)  # the last agent token of each row
                    reward[torch.arange(len(micro)), last] += rewards[micro]
                    adv = gae(reward, old_values, mask, gamma, lam)
                    experience.append((micro, batch, old_values, adv, adv + old_values))
                every = torch.cat([a[b.agent_mask > 0] for _, b, _, a, _ in experience])  # whitened over the batch
                mean, std = every.mean(), every.std()
            # the update: policy and value losses, one backward per micro-batch
            policy.train()
            value_model.train()
            optimizer.zero_grad(set_to_none=True)
            for micro, batch, old_values, adv, returns in experience:
                mask = batch.agent_mask
                n_tok = mask.sum().clamp(min=1.0)
                adv = (adv - mean) / (std + 1e-8)
                logp = sequence_logprobs(
                    policy, batch.input_ids, batch.attention_mask, config.logprob_chunk, target_mask=mask
                )
                ratio = torch.exp(logp - batch.sampler_logprobs)
                surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
                policy_loss = -(surrogate * mask).sum() / n_tok
                v = values(batch)
                v_clipped = old_values + (v - old_values).clamp(-value_clip, value_clip)
                value_loss = 0.5 * (torch.maximum((v - returns) ** 2, (v_clipped - returns) ** 2) * mask).sum() / n_tok
                ((policy_loss + value_coef * value_loss) * len(micro) / len(idx)).backward()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm))
            optimizer.step()
            return grad_norm

        return self.timed(step)

    def trl(self) -> dict[str, Any]:
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer

        from agentloop.learner.model import lora_config

        config = self.loop_config()

        class PreparedGRPOTrainer(GRPOTrainer):  # type: ignore[misc]
            """Trains on batches prepared here instead of generating them."""

            def _prepare_inputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
                return inputs

        P = int(self.batch["prompt_len"])
        ids, agent, old = self.batch["input_ids"], self.batch["agent_mask"], self.batch["sampler_logprobs"]
        advantages = self.batch["advantages"]

        def inputs(micro: list[int]) -> dict[str, Any]:
            prompt, completion = ids[micro, :P], ids[micro, P:]
            tool_mask = agent[micro, P:]  # the loss counts the agent's tokens, not the observations
            return {
                "prompt_ids": prompt,
                "prompt_mask": torch.ones_like(prompt),
                "completion_ids": completion,
                "completion_mask": torch.ones_like(completion),
                "tool_mask": tool_mask,
                "advantages": advantages[micro],
                "old_per_token_logps": old[micro, P:],  # log p(completion token j), as TRL aligns them
                "num_items_in_batch": tool_mask.sum(),
            }

        with tempfile.TemporaryDirectory() as out:
            args = GRPOConfig(
                output_dir=out,
                use_cpu=True,
                bf16=False,
                gradient_checkpointing=False,
                per_device_train_batch_size=self.micro,
                gradient_accumulation_steps=max(1, self.n // self.micro),
                num_generations=int(self.batch["group"]),
                max_completion_length=ids.shape[1] - P,
                learning_rate=config.lr,
                weight_decay=config.weight_decay,
                max_grad_norm=config.max_grad_norm,
                lr_scheduler_type="constant",
                optim="adamw_torch",
                beta=0.0,
                scale_rewards="none",
                loss_type="grpo",
                importance_sampling_level="token",
                epsilon=1 - 1 / (1 + config.clip_eps),
                epsilon_high=config.clip_eps,
                num_iterations=1,
                disable_dropout=True,
                report_to="none",
                save_strategy="no",
                seed=0,
            )
            trainer = PreparedGRPOTrainer(
                model=self.model,
                reward_funcs=no_reward,  # never called: nothing is generated
                args=args,
                train_dataset=Dataset.from_dict({"prompt": ["-"] * self.n}),
                processing_class=self.tokenizer,
                peft_config=lora_config(config),
            )
            trainer.create_optimizer()
            model, optimizer = trainer.model, trainer.optimizer
            assert model is not None and optimizer is not None
            params = [p for p in model.parameters() if p.requires_grad]

            def step(idx: list[int]) -> float:
                optimizer.zero_grad(set_to_none=True)
                micros = micro_batches(idx, self.micro)
                trainer.current_gradient_accumulation_steps = len(micros)
                for micro in micros:
                    trainer.training_step(model, inputs(micro), None)
                grad_norm = float(trainer.accelerator.clip_grad_norm_(params, config.max_grad_norm))
                optimizer.step()
                return grad_norm

            return self.timed(step)

    def logprob_chunked(self) -> dict[str, Any]:
        from agentloop.learner.loop import sequence_logprobs

        return self.logprob(lambda ids, attn: sequence_logprobs(self.model, ids, attn, self.spec["logprob_chunk"]))

    def logprob_naive(self) -> dict[str, Any]:
        from agentloop.learner.loop import naive_sequence_logprobs

        return self.logprob(lambda ids, attn: naive_sequence_logprobs(self.model, ids, attn))

    @torch.no_grad()
    def logprob(self, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> dict[str, Any]:
        t0 = time.perf_counter()
        out = fn(self.long_ids, torch.ones_like(self.long_ids))  # (1, T-1)
        return {"seconds": round(time.perf_counter() - t0, 3), "checksum": float(out.sum())}


def no_reward(completions: list[Any], **_: Any) -> list[float | None]:
    return [0.0] * len(completions)


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    """Generalised advantage estimation over the masked positions only (observation tokens are not actions):
    delta_t = r_t + gamma V(next agent token) - V_t;  A_t = delta_t + gamma lambda A_next."""
    B, T = rewards.shape
    adv = torch.zeros_like(rewards)
    carry, next_value = torch.zeros(B), torch.zeros(B)
    for t in range(T - 1, -1, -1):
        on = mask[:, t] > 0
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        here = delta + gamma * lam * carry
        adv[:, t] = torch.where(on, here, torch.zeros_like(here))
        carry = torch.where(on, here, carry)
        next_value = torch.where(on, values[:, t], next_value)
    return adv


def run_child(name: str, spec_path: Path, mode: str) -> None:
    spec = {**json.loads(spec_path.read_text()), "mode": mode}
    t0 = time.perf_counter()
    child = Child(spec)
    setup_s, setup_peak, start = time.perf_counter() - t0, peak_mb(), rss_mb()
    reset_peak()
    result = getattr(child, name)()
    work_peak = peak_mb()
    result.update(
        peak_mb=max(setup_peak, work_peak),  # absolute, loading included
        increment_mb=work_peak - start,  # what this configuration adds to the loaded process
        loaded_mb=start,
        setup_s=round(setup_s, 3),
    )
    print(json.dumps(result))


# --- the parent -----------------------------------------------------------------------------------


def spawn(name: str, mode: str, spec_path: Path, timeout_s: float) -> dict[str, Any]:
    """Run one configuration in a fresh interpreter (ru_maxrss only ever grows within a process). `mode`:
    "time" with the default allocator, or "memory" with MEMORY_ENV."""
    t0 = time.perf_counter()
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", **(MEMORY_ENV if mode == "memory" else {})}
    proc = subprocess.run(
        [sys.executable, __file__, "--child", name, "--mode", mode, "--spec", str(spec_path)],
        capture_output=True,
        text=True,
        timeout=timeout_s,  # subprocess default: no limit; a stuck child should fail the run, not hang it
        env=env,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"child {name!r} ({mode}) failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    what = f"{result['tokens_per_s']:.1f} tokens/s" if mode == "time" else f"peak {result['peak_mb']:.0f} MB"
    log(f"{name} ({mode}): {what} ({time.perf_counter() - t0:.0f} s)")
    return result


def ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b > 0 else float("nan")


def verdict(key: str, value: float) -> str:
    op, bound = TARGETS[key]
    ok = value <= bound if op == "<=" else value >= bound
    return f"{'met' if ok else 'missed'} ({op} {bound})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="8 rollouts x 64 tokens, 2 repeats")
    ap.add_argument("--json", action="store_true", help="print only the JSON line on stdout (progress on stderr)")
    ap.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    ap.add_argument("--model", default=None, help="model name or directory, or 'random' (default: AGENTLOOP_MODEL)")
    ap.add_argument("--rollouts", type=int, default=8, help="rollouts in the batch (groups of --group)")
    ap.add_argument("--group", type=int, default=4, help="rollouts per task (K)")
    ap.add_argument("--tokens", type=int, default=None, help="tokens per rollout (default 512; --quick 64)")
    ap.add_argument("--turns", type=int, default=4, help="agent turns per rollout")
    ap.add_argument("--micro-batch", type=int, default=4, help="rollouts per forward/backward")
    ap.add_argument("--repeats", type=int, default=None, help="timed updates (default 3; --quick 2)")
    ap.add_argument("--logprob-tokens", type=int, default=4096, help="sequence length of the log-prob comparison")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads per process (default 1: with more, other work on the same cores makes the threads wait "
        "on each other at every operation, and timings swing several-fold)",
    )
    ap.add_argument("--child", choices=CHILDREN, help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=("time", "memory"), default="time", help=argparse.SUPPRESS)
    ap.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        run_child(args.child, args.spec, args.mode)
        return

    try:
        import trl
    except ImportError:
        sys.exit("bench/learner_memory.py compares with TRL: pip install -e '.[bench]'")
    if args.rollouts % args.group or args.rollouts % args.micro_batch:
        sys.exit("--rollouts must be a multiple of --group and of --micro-batch")
    length = args.tokens or (64 if args.quick else 512)
    repeats = args.repeats or (2 if args.quick else 3)
    torch.set_num_threads(args.threads)
    threads = args.threads

    t_start, load_start = time.perf_counter(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        model_dir, model_label = resolve_model(args.model, scratch)
        log(f"model {model_label}; preparing {args.rollouts} rollouts x {length} tokens")
        model, _ = load_model(model_dir)
        batch = make_batch(model, args.rollouts, args.group, length, args.turns, args.micro_batch, seed=0)
        batch["long_ids"] = torch.randint(
            0, model.config.vocab_size, (1, args.logprob_tokens), generator=torch.Generator().manual_seed(1)
        )
        agent_frac = float(batch["agent_mask"].float().mean())
        del model
        torch.save(batch, scratch / "batch.pt")
        spec = {
            "model_dir": str(model_dir),
            "batch": str(scratch / "batch.pt"),
            "micro_batch": args.micro_batch,
            "repeats": repeats,
            "threads": threads,
            "logprob_chunk": 512,
        }
        spec_path = scratch / "spec.json"
        spec_path.write_text(json.dumps(spec))
        timed, mem = {}, {}
        for name in CHILDREN:
            if name in UPDATES:
                timed[name] = spawn(name, "time", spec_path, timeout_s=3600)
            mem[name] = spawn(name, "memory", spec_path, timeout_s=3600)

    inc = {name: run["increment_mb"] for name, run in mem.items()}
    tps = {name: timed[name]["tokens_per_s"] for name in UPDATES}
    cpu_tps = {name: timed[name]["tokens_per_cpu_s"] for name in UPDATES}
    result: dict[str, Any] = {
        "loop_sft_mem_ratio": ratio(inc["loop"], inc["sft"]),
        "loop_sft_tps_ratio": ratio(tps["loop"], tps["sft"]),
        "loop_trl_tps_ratio": ratio(tps["loop"], tps["trl"]),
        "loop_trl_mem_ratio": ratio(inc["loop"], inc["trl"]),
        "loop_ppo_mem_ratio": ratio(inc["loop"], inc["ppo"]),
        "loop_ppo_tps_ratio": ratio(tps["loop"], tps["ppo"]),
        # the same update with activation checkpointing (LoopConfig.activation_checkpointing) / without
        "ckpt_loop_mem_ratio": ratio(inc["loop_ckpt"], inc["loop"]),
        "ckpt_loop_tps_ratio": ratio(tps["loop_ckpt"], tps["loop"]),
        # the same over CPU time: with one thread, steadier than wall time when other work shares the cores
        **{f"loop_{n}_cpu_tps_ratio": ratio(cpu_tps["loop"], cpu_tps[n]) for n in ("sft", "trl", "ppo")},
        "logprob_mem_ratio": ratio(inc["logprob_chunked"], inc["logprob_naive"]),
        "peak_mb": {name: round(run["peak_mb"], 1) for name, run in mem.items()},
        "increment_mb": {name: round(v, 1) for name, v in inc.items()},
        # the timing processes' peaks, default allocator (retains freed memory; noisier, not used in ratios)
        "increment_mb_default_malloc": {name: round(run["increment_mb"], 1) for name, run in timed.items()},
        "loaded_mb": round(statistics.median(run["loaded_mb"] for run in mem.values()), 1),
        "tokens_per_s": {name: round(v, 2) for name, v in tps.items()},
        "update_seconds": {name: timed[name]["seconds"] for name in tps},
        "grad_norm_first": {name: timed[name]["grad_norm_first"] for name in tps},
        # LOOP and TRL start from the same adapter and take the same warm-up step: the same objective gives
        # the same gradient
        "loop_trl_grad_rel_diff": abs(timed["loop"]["grad_norm_first"] - timed["trl"]["grad_norm_first"])
        / timed["loop"]["grad_norm_first"],
        "logprob_seconds": {name: mem[f"logprob_{name}"]["seconds"] for name in ("chunked", "naive")},
        "model": model_label,
        "batch": {
            "rollouts": args.rollouts,
            "group": args.group,
            "tokens_per_rollout": length,
            "agent_token_frac": round(agent_frac, 3),
            "turns": args.turns,
            "micro_batch": args.micro_batch,
            "repeats": repeats,
        },
        "logprob_tokens": args.logprob_tokens,
        "trl_version": trl.__version__,
        "torch_threads": threads,
        "quick": args.quick,
        "wall_s": round(time.perf_counter() - t_start, 1),
        # other work on the machine slows the updates unevenly: read tokens/s with the load in mind
        "load_avg_1m": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        "tokens_per_cpu_s": {name: round(v, 2) for name, v in cpu_tps.items()},
    }
    result["targets"] = {key: verdict(key, result[key]) for key in TARGETS}
    if args.write_docs:
        write_docs(result)
    if not args.json:
        print(summary(result))
    emit(result)


def summary(r: dict[str, Any]) -> str:
    lines = [f"model {r['model']}; batch {r['batch']}"]
    for name in UPDATES:
        lines.append(
            f"  {name:9s} {r['tokens_per_s'][name]:8.2f} tokens/s  peak {r['peak_mb'][name]:7.0f} MB"
            f"  (+{r['increment_mb'][name]:.0f} MB over the loaded process's {r['loaded_mb']:.0f} MB)"
        )
    lines += [f"  {k} = {r[k]}: {v}" for k, v in r["targets"].items()]
    return "\n".join(lines)


def write_docs(r: dict[str, Any]) -> None:
    cmd = " ".join(["python bench/learner_memory.py", *sys.argv[1:]])
    b = r["batch"]
    rows = {
        "loop": "LOOP: agentloop `update()`; one model, no value net, no reference",
        "sft": "supervised LoRA: -mean log p(agent tokens), same log-prob code",
        "ppo": "PPO: + frozen reference copy, + value model (base copy, LoRA, scalar head), GAE",
        "trl": f"TRL {r['trl_version']} `GRPOTrainer`, LOOP's objective, generation skipped",
        "loop_ckpt": "LOOP with `activation_checkpointing` (layers recomputed in backward)",
    }
    table = "\n".join(
        f"| {label} | {r['tokens_per_s'][n]} | {r['tokens_per_cpu_s'][n]} | {r['peak_mb'][n]:.0f} |"
        f" {r['increment_mb'][n]:.0f} | {ratio(r['tokens_per_s']['loop'], r['tokens_per_s'][n])} |"
        f" {ratio(r['increment_mb']['loop'], r['increment_mb'][n])} |"
        for n, label in rows.items()
    )
    targets = "\n".join(f"| `{k}` | {r[k]} | {v} |" for k, v in r["targets"].items())
    eps = LoopConfig().clip_eps
    agent_pct = round(b["agent_token_frac"] * 100)
    quick = (
        " (`--quick`: short rollouts, where fixed costs weigh more than at the default 512 tokens)"
        if r["quick"]
        else ""
    )
    shared = ""
    if max(r["load_avg_1m"]) > (os.cpu_count() or 1) + 0.5:  # more runnable work than this benchmark's
        shared = (
            "\nThe machine was shared with other work, which slows each configuration by a different amount:"
            " the wall-clock tokens/s ratios carry that noise, the CPU-time ones much less; the memory figures none."
        )
    write_section(
        "learner_memory",
        f"""
## Learner memory and speed (`bench/learner_memory.py`)

`{cmd}` on {machine()}; model `{r["model"]}`, fp32, LoRA r16 alpha 32 on
q,k,v,o,gate,up,down, AdamW, no activation checkpointing except in the last row. Batch:
{b["rollouts"]} synthetic rollouts x {b["tokens_per_rollout"]} tokens (groups of {b["group"]}, {b["turns"]} agent
turns, {agent_pct}% agent tokens){quick}, micro-batches of {b["micro_batch"]}, one optimizer step per update.
tokens/s = the batch's tokens / seconds of
one update (median of {b["repeats"]}, after a warm-up); per CPU-second = the same over the process's CPU time.
Memory comes from a second process per configuration with glibc's mmap threshold fixed
(`MALLOC_MMAP_THRESHOLD_=131072`: freed tensors leave the RSS): it loads the same libraries, model and batch
(about {r["loaded_mb"]:.0f} MB), resets its peak RSS, runs a warm-up and one update; "+MB" is the peak RSS from the
reset on minus the RSS at the reset, "peak MB" the process's absolute peak; memory ratios are of "+MB". What
each row times is in the script's docstring.

| update | tokens/s | tokens per CPU-s | peak MB | +MB | LOOP / this, tokens/s | LOOP / this, +MB |
|---|---|---|---|---|---|---|
{table}

TRL: `beta=0.0` (no reference model), `scale_rewards="none"`, `loss_type="grpo"` (each sequence's token
mean, then the mean over sequences, as LOOP), `epsilon={1 - 1 / (1 + eps):.4f}`, `epsilon_high={eps}` (LOOP's
clip to [1/(1+eps), 1+eps]), `num_iterations=1`, `bf16=False`, `gradient_checkpointing=False`, the same LoRA as
`peft_config`; the sampler's log-probs as `old_per_token_logps`, the agent-token mask as `tool_mask`. After the
same warm-up step from the same adapter, LOOP's and TRL's gradient norms differ by
{r["loop_trl_grad_rel_diff"]:.1e} (relative): the same objective.

Where the differences come from: PPO holds two more copies of the base (the reference and the value
model) and runs the value model forward and backward besides the policy, plus two no-grad forwards for
the reference log-probs and the old values. TRL's fused LM head, on CPU, projects every position of the
sequence (prompt and observations too, masked afterwards) and also computes the entropy; LOOP's runs the
output layer over the agent's tokens only. The supervised step and LOOP differ only by the clipped
ratio's elementwise terms.

Activation checkpointing keeps each decoder layer's input and recomputes the layer in backward: LOOP's
update with it takes {r["ckpt_loop_mem_ratio"]} of the memory and runs at {r["ckpt_loop_tps_ratio"]} of the
tokens/s of the update without it. Besides the recompute, it gives up the shared-opening forward (rows run
whole), which this batch's groups would otherwise use. The saving grows with the tokens in a micro-batch.

Token log-probs of one {r["logprob_tokens"]}-token sequence, forward only under `no_grad`, every position:
chunked `sequence_logprobs` +{r["increment_mb"]["logprob_chunked"]:.0f} MB ({r["logprob_seconds"]["chunked"]} s),
a full `log_softmax(logits.float())` gather +{r["increment_mb"]["logprob_naive"]:.0f} MB
({r["logprob_seconds"]["naive"]} s).

| target | measured | |
|---|---|---|
{targets}

The same tokens/s ratios over CPU time: LOOP / supervised {r["loop_sft_cpu_tps_ratio"]}, LOOP / TRL
{r["loop_trl_cpu_tps_ratio"]}, LOOP / PPO {r["loop_ppo_cpu_tps_ratio"]}. 1-minute load average
{r["load_avg_1m"][0]} at the start and {r["load_avg_1m"][1]} at the end, on {os.cpu_count()} cores.{shared}
""",
    )


if __name__ == "__main__":
    main()
