"""One LOOP update of a tiny LoRA model under accelerate, for the multi-process test:
`torchrun --nproc_per_node N tests/learner/ddp_update.py MODEL_DIR OUT_DIR` (also runs as one process).
Every process writes its final LoRA weights to OUT_DIR/rank<R>.pt."""

import random
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM

from agentloop.learner.config import LoopConfig
from agentloop.learner.model import lora_model
from agentloop.learner.rollouts import Rollout
from agentloop.learner.update import LogprobModel, compute_logprobs, update


def synthetic_rollouts(vocab: int, n: int = 8, seed: int = 0) -> tuple[list[Rollout], list[float]]:
    rng = random.Random(seed)
    out, advs = [], []
    for i in range(n):
        length = rng.randint(24, 40)
        ids = [rng.randrange(vocab) for _ in range(length)]
        mask = [0] * 10 + [1] * 8 + [0] * 4 + [1] * (length - 22)  # two agent turns between context tokens
        turns = [-1] * 10 + [0] * 8 + [-1] * 4 + [1] * (length - 22)
        out.append(Rollout(f"t{i // 4}", ids, mask, turns, [0.0] * length, 1.0 if i % 2 else 0.0, bool(i % 2)))
        advs.append(0.5 if i % 2 else -0.5)
    return out, advs


def main(model_dir: str, out_dir: str) -> None:
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    config = LoopConfig(lr=1e-3, epochs=2, minibatch_size=4, micro_batch_size=1, lora_r=4, lora_alpha=8)
    model = lora_model(AutoModelForCausalLM.from_pretrained(model_dir), config, None)
    module = LogprobModel(model, config.logprob_chunk)
    rollouts, advs = synthetic_rollouts(model.config.vocab_size)
    sampled = compute_logprobs(module, rollouts, 0, 4, accelerator.device)  # the sampler's numbers
    for r, lp in zip(rollouts, sampled, strict=True):
        r.sampler_logprobs = [0.0, *lp.tolist()]
    optimizer = accelerator.prepare(torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.lr))
    stats = update(module, optimizer, accelerator, rollouts, advs, None, config, 0, random.Random(0))
    assert stats["update/steps"] == 4, stats
    weights = {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    torch.save(weights, Path(out_dir) / f"rank{accelerator.process_index}.pt")
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
