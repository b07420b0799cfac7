"""Speed of one supervised step on real oracle episodes, by where the LoRA adapter sits: on every decoder
layer (the learner's default) or on the upper layers only (backward then stops at the lowest adapted layer).

    python bench/sft_step.py [--quick] [--episodes N] [--top-layers K] [--write-docs]

Both variants train on the same episodes (the first train tasks' oracle solutions, played through the
episode loop), one after the other in this process, each after a warm-up step: tokens/s = the episodes'
tokens / the seconds of one `supervised_steps` step. Last line: a JSON object with `all_tps`, `top_tps` and
`top_all_tps_ratio`.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time

import torch

from agentloop.agent.episode import Limits
from agentloop.agent.eval_runs import world_tasks
from agentloop.apps.builtin import BUILTIN
from agentloop.learner.experts import expert_rollouts
from agentloop.learner.sft import supervised_steps
from agentloop.policy.models import resolve_model_dir
from agentloop.settings import get_settings

from report import emit, machine, write_section

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def step_tps(model_dir: str, demos: list, pad_id: int, layers: list[int] | None) -> float:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    for p in base.parameters():
        p.requires_grad_(False)
    config = LoraConfig(r=16, lora_alpha=32, target_modules=TARGETS, layers_to_transform=layers, task_type="CAUSAL_LM")
    model = get_peft_model(base, config)
    supervised_steps(model, demos, pad_id, 1, 1e-4, batch_size=len(demos))  # warm-up
    t0 = time.perf_counter()
    supervised_steps(model, demos, pad_id, 1, 1e-4, batch_size=len(demos))
    seconds = time.perf_counter() - t0
    del model, base
    gc.collect()
    return sum(len(r.token_ids) for r in demos) / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one short episode")
    ap.add_argument("--episodes", type=int, default=2, help="oracle episodes in the step")
    ap.add_argument("--top-layers", type=int, default=10, help="K: the variant adapts the upper K layers only")
    ap.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    args = ap.parse_args()
    settings = get_settings()
    model_dir = str(resolve_model_dir(settings.model, settings.models_dir))
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    n_layers = int(AutoConfig.from_pretrained(model_dir).num_hidden_layers)
    tasks = world_tasks(BUILTIN, "train", None)[: 1 if args.quick else args.episodes]
    demos = expert_rollouts(tok, tasks, Limits(max_turns=2 if args.quick else 16, max_new_tokens=4096))
    tokens = [len(r.token_ids) for r in demos]
    print(f"episodes of {tokens} tokens; {n_layers} layers", file=sys.stderr)
    top = list(range(n_layers - args.top_layers, n_layers))
    all_tps = step_tps(model_dir, demos, tok.eos_token_id, None)
    top_tps = step_tps(model_dir, demos, tok.eos_token_id, top)
    result = {
        "episodes_tokens": tokens,
        "layers": n_layers,
        "top_layers": args.top_layers,
        "all_tps": round(all_tps, 1),
        "top_tps": round(top_tps, 1),
        "top_all_tps_ratio": round(top_tps / all_tps, 3),
    }
    if args.write_docs:
        write_section(
            "sft_step",
            f"## Supervised step by LoRA layout (`bench/sft_step.py`)\n\n"
            f"`python bench/sft_step.py --episodes {args.episodes} --top-layers {args.top_layers} --write-docs` "
            f"on {machine()}; model `{settings.model_name}`, fp32, LoRA r16 on q,k,v,o,gate,up,down, one AdamW step "
            f"on {len(tokens)} oracle episode(s) of {tokens} tokens after a warm-up step.\n\n"
            "| LoRA on | tokens/s |\n|---|---|\n"
            f"| all {n_layers} layers (default) | {result['all_tps']} |\n"
            f"| the upper {args.top_layers} layers | {result['top_tps']} |\n\n"
            f"Ratio upper-{args.top_layers} / all: {result['top_all_tps_ratio']}. At the default's speed one "
            "oracle episode of ~2300 tokens costs close to a minute of supervised training on 2 cores, which is "
            "what bounds the StepAgent curve's budgets; whether adapting fewer layers learns as well is not "
            "measured here.\n",
        )
    emit(result)


if __name__ == "__main__":
    main()
