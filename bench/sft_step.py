"""Speed and memory of one supervised step on real oracle episodes (fresh `<scenario>@<seed>` train tasks of
the built-in world), four layouts side by side:

* whole: LoRA on every decoder layer, micro-batches of at most 4096 padded tokens (the learner's defaults);
  an episode of ~2500 tokens then goes through alone, its shared opening run once per episode;
* fast: LoRA on the upper `--top-layers` layers only (`lora_layers`: the layers below run without
  gradients), micro-batches of `--micro-tokens` tokens counting the episodes' shared opening (the system
  prompt and worked example, ~1000 tokens) once;
* frozen: the whole layout with `prompt_gradients` off: the tokens before the first agent turn run without
  gradients (the same loss; the backward skips the prompt and does not train how it is read);
* greedy: the whole layout with StepAgent's greedy-inspection loss (`greedy_dpo_loss`: the SFT anchor plus
  step-level DPO where the greedy token leaves the expert's, reference = the weights as they are), which
  `stepagent-greedy` runs in place of SFT's: the same passes plus an argmax over the vocabulary.

    python bench/sft_step.py [--quick] [--episodes N] [--top-layers K] [--micro-tokens T]
        [--prompt-example fixed|nearest] [--write-docs]

`--prompt-example nearest`: every episode shows its own nearest solved task (agent/examples.py) instead of
the one fixed example, so that episodes share only the system prompt's start (the bench prints how many tokens).

Each layout runs in a process of its own (so that its peak RSS is its own), on the same episodes: a warm-up
step on one episode, then one timed `supervised_steps` step on all of them; tokens/s = the episodes'
tokens / that step's seconds. Last line: a JSON object with `whole_tps`, `fast_tps`, `frozen_tps`,
`greedy_tps`, `fast_whole_ratio`, `frozen_whole_ratio` and `greedy_whole_ratio`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import resource
import subprocess
import sys
import time
from typing import Any

import torch

from agentloop.agent.episode import Limits
from agentloop.learner.config import LoopConfig
from agentloop.learner.experts import expert_rollouts
from agentloop.learner.loop import shared_opening
from agentloop.learner.model import lora_model
from agentloop.learner.sft import micro_batches, supervised_steps
from agentloop.learner.stepagent_trainer import greedy_dpo_loss
from agentloop.learner.task_source import TaskSource
from agentloop.learner.update import Batch
from agentloop.policy.models import resolve_model_dir
from agentloop.settings import get_settings

from report import emit, machine, write_section

WHOLE_MICRO_TOKENS = 4096
LAYOUTS = ("whole", "fast", "frozen", "greedy")


def greedy_loss(model: Any, batch: Batch, chunk: int) -> torch.Tensor:
    """stepagent-greedy's per-sequence loss with the settings its runs use (beta 1, anchor 1, cycle reference)."""
    return greedy_dpo_loss(model, batch, chunk, beta=1.0, anchor_weight=1.0, reference="cycle")


def episodes(tokenizer: Any, n: int, quick: bool) -> list[Any]:
    tasks = TaskSource(world="builtin", train=[]).fresh(random.Random(0), n)
    return expert_rollouts(tokenizer, tasks, Limits(max_turns=2 if quick else 30, max_new_tokens=4096))


def child(layout: str, n: int, quick: bool, top_layers: int, micro_tokens: int) -> dict[str, Any]:
    """One layout's figures (run in its own process)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    settings = get_settings()
    model_dir = resolve_model_dir(settings.model, settings.models_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    demos = episodes(tok, n, quick)
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoopConfig(lora_layers=top_layers if layout == "fast" else 0)
    model = lora_model(base, config, None)
    micro = micro_tokens if layout == "fast" else WHOLE_MICRO_TOKENS
    grads, pad = layout != "frozen", tok.eos_token_id
    loss = greedy_loss if layout == "greedy" else None
    step = functools.partial(supervised_steps, micro_tokens=micro, prompt_gradients=grads, sequence_loss=loss)
    # a warm-up step, then the timed one
    step(model, demos[:1], pad, 1, 1e-4, batch_size=1)
    t0 = time.perf_counter()
    step(model, demos, pad, 1, 1e-4, batch_size=len(demos))
    seconds = time.perf_counter() - t0
    tokens = [len(r.token_ids) for r in demos]
    groups = micro_batches(demos, micro)
    return {
        "layout": layout,
        "tokens": tokens,
        "seconds": round(seconds, 1),
        "tps": round(sum(tokens) / seconds, 1),
        "micro_batches": [len(g) for g in groups],
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def run_child(layout: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", layout, "--episodes", str(args.episodes)]
    cmd += ["--top-layers", str(args.top_layers), "--micro-tokens", str(args.micro_tokens)]
    cmd += ["--prompt-example", args.prompt_example] + (["--quick"] if args.quick else [])
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="two short episodes")
    ap.add_argument("--episodes", type=int, default=4, help="oracle episodes in the step (the bench's batch)")
    ap.add_argument("--top-layers", type=int, default=10, help="K: the fast layout adapts the upper K layers")
    ap.add_argument("--micro-tokens", type=int, default=8192, help="the fast layout's micro-batch budget")
    ap.add_argument(
        "--prompt-example",
        choices=("fixed", "nearest"),
        default="fixed",
        help="the worked example each episode shows (AGENTLOOP_PROMPT_EXAMPLE; agent/examples.py)",
    )
    ap.add_argument("--child", choices=LAYOUTS, help=argparse.SUPPRESS)
    ap.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    args = ap.parse_args()
    if args.quick:
        args.episodes = 2
    os.environ["AGENTLOOP_PROMPT_EXAMPLE"] = args.prompt_example
    get_settings.cache_clear()
    if args.child:
        print(json.dumps(child(args.child, args.episodes, args.quick, args.top_layers, args.micro_tokens)))
        return
    from transformers import AutoTokenizer

    settings = get_settings()
    tok = AutoTokenizer.from_pretrained(resolve_model_dir(settings.model, settings.models_dir))
    demos = episodes(tok, args.episodes, args.quick)
    ids = [r.token_ids[: min(len(r.token_ids) for r in demos)] for r in demos]
    opening = shared_opening(torch.tensor(ids), None)
    print(f"episodes of {[len(r.token_ids) for r in demos]} tokens, {opening} shared", file=sys.stderr)
    whole, fast, frozen, greedy = (run_child(layout, args) for layout in LAYOUTS)
    result = {
        "prompt_example": args.prompt_example,
        "episodes_tokens": whole["tokens"],
        "shared_opening": opening,
        "top_layers": args.top_layers,
        "micro_tokens": args.micro_tokens,
        "whole_tps": whole["tps"],
        "fast_tps": fast["tps"],
        "frozen_tps": frozen["tps"],
        "greedy_tps": greedy["tps"],
        "fast_whole_ratio": round(fast["tps"] / whole["tps"], 3),
        "frozen_whole_ratio": round(frozen["tps"] / whole["tps"], 3),
        "greedy_whole_ratio": round(greedy["tps"] / whole["tps"], 3),
        "whole_peak_rss_mb": whole["peak_rss_mb"],
        "fast_peak_rss_mb": fast["peak_rss_mb"],
        "frozen_peak_rss_mb": frozen["peak_rss_mb"],
        "greedy_peak_rss_mb": greedy["peak_rss_mb"],
        "whole_micro_batches": whole["micro_batches"],
        "fast_micro_batches": fast["micro_batches"],
    }
    if args.write_docs:
        flags = f"--episodes {args.episodes} --top-layers {args.top_layers} --micro-tokens {args.micro_tokens}"
        flags += f" --prompt-example {args.prompt_example}" if args.prompt_example != "fixed" else ""
        fixed = args.prompt_example == "fixed"
        shown = "the system prompt and worked example" if fixed else "the system prompt's start"
        write_section(
            "sft_step",
            f"## Supervised step: whole rows vs shared opening and upper layers (`bench/sft_step.py`)\n\n"
            f"`python bench/sft_step.py {flags} --write-docs` on {machine()}; model `{settings.model_name}`, fp32, "
            f"LoRA r16 on q,k,v,o,gate,up,down; one AdamW step on {len(whole['tokens'])} oracle episodes of fresh "
            f"procedural train tasks ({whole['tokens']} tokens, the first {opening} the same in every one: "
            f"{shown}), after a warm-up step; each layout in a process of its own.\n\n"
            "| layout | micro-batches (episodes each) | tokens/s | peak RSS (MB) |\n|---|---|---|---|\n"
            f"| whole: LoRA on all layers, {WHOLE_MICRO_TOKENS} padded tokens per micro-batch (defaults) | "
            f"{whole['micro_batches']} | {whole['tps']} | {whole['peak_rss_mb']} |\n"
            f"| fast: LoRA on the upper {args.top_layers} layers (`lora_layers`), {args.micro_tokens} tokens per "
            f"micro-batch, the shared opening counted once | {fast['micro_batches']} | {fast['tps']} | "
            f"{fast['peak_rss_mb']} |\n"
            f"| frozen: the whole layout, the prompt without gradients (`prompt_gradients` off) | "
            f"{frozen['micro_batches']} | {frozen['tps']} | {frozen['peak_rss_mb']} |\n"
            f"| greedy: the whole layout with stepagent-greedy's loss (`greedy_dpo_loss`, cycle reference) | "
            f"{greedy['micro_batches']} | {greedy['tps']} | {greedy['peak_rss_mb']} |\n\n"
            f"Speedup fast / whole: {result['fast_whole_ratio']}x, frozen / whole: {result['frozen_whole_ratio']}x, "
            f"greedy / whole: {result['greedy_whole_ratio']}x, "
            "measured one after the other in one run. "
            "Both layouts profit from the prompt's opening being the same for every task (before, the persona "
            "named the task's person on the first line and the system prompt listed the task's apps: episodes "
            "shared 11 tokens). "
            "Whether adapting the upper layers only, or not training how the prompt is read, learns as well is for "
            "the learning curves to show (`bench/stepagent_curve.py --lora-layers`, `--no-prompt-gradients`).\n",
        )
    emit(result)


if __name__ == "__main__":
    main()
