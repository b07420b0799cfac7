"""The learner's forward+backward over a micro-batch of rollouts with the shared opening run once, vs the
whole batch run row by row through the decoder (the opening repeated in every row), side by side.

    python bench/shared_opening.py [--quick] [--model DIR] [--rollouts N] [--max-turns T] [--repeats R] [--json]
        [--write-docs]

The rollouts are K episodes of one built-in train task sampled by the model (temperature 1.0) through the
real episode loop, as one task's group arrives in an update (the learner puts a task's rollouts side by side
in its micro-batches). Both ways compute the loss of the
LOOP update (sum of agent-token log-probs) and its LoRA gradients; they are checked equal before timing.
Repeats alternate the two ways so that the machine's load hits both alike. Time only: in one process,
memory freed by one pass stays resident for the next, so peak memory is not compared here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import torch

import agentloop.learner.loop as loop
from agentloop.agent.episode import Limits
from agentloop.agent.eval_runs import world_tasks
from agentloop.apps.registry import get_world
from agentloop.learner.config import LoopConfig
from agentloop.learner.model import lora_model
from agentloop.learner.rollouts import run_local
from agentloop.learner.update import collate
from agentloop.policy.local import LocalPolicy
from agentloop.policy.models import resolve_model_dir
from agentloop.settings import get_settings

from report import emit, machine, write_section


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def one_pass(model: Any, batch: Any, params: list[torch.Tensor], shared: bool) -> tuple[float, Any]:
    """Seconds of one forward+backward; the log-probs and gradients."""
    loop.SHARED_OPENING_MIN_TOKENS = 16 if shared else 10**9  # the switch the learner itself reads
    for p in params:
        p.grad = None
    t0 = time.perf_counter()
    logp = loop.sequence_logprobs(model, batch.input_ids, batch.attention_mask, 512, target_mask=batch.agent_mask)
    (logp * batch.agent_mask).sum().backward()
    took = time.perf_counter() - t0
    return took, (logp.detach(), [p.grad.clone() for p in params])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 rollouts of 2 turns, 1 repeat")
    ap.add_argument("--model", default=None, help="model name or directory (default: AGENTLOOP_MODEL)")
    ap.add_argument("--rollouts", type=int, default=None, help="rollouts in the micro-batch")
    ap.add_argument("--max-turns", type=int, default=None, help="turn limit of each sampled rollout")
    ap.add_argument("--max-new-tokens", type=int, default=96, help="new tokens per turn")
    ap.add_argument("--repeats", type=int, default=None, help="timed passes of each way")
    ap.add_argument("--json", action="store_true", help="print only the JSON object")
    ap.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    args = ap.parse_args()
    for name, full, quick in (("rollouts", 4, 2), ("max_turns", 4, 2), ("repeats", 3, 1)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.rollouts < 2 or args.repeats < 1 or args.max_turns < 1:
        ap.error("--rollouts must be >= 2, --repeats and --max-turns >= 1")

    from transformers import AutoModelForCausalLM, AutoTokenizer

    settings = get_settings()
    model_dir = resolve_model_dir(args.model or settings.model, settings.models_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    torch.manual_seed(0)
    model = lora_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), LoopConfig(), None)
    for p in model.parameters():  # a trained adapter, not the identity
        if p.requires_grad:
            p.data.normal_(0, 0.02)
    params = [p for p in model.parameters() if p.requires_grad]
    task = world_tasks(get_world("builtin"), "train")[0]
    limits = Limits(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens, wall_time_s=1e9, temperature=1.0)
    progress(f"sampling {args.rollouts} rollouts of {task.task_ref} ({args.max_turns} turns)")
    policy = LocalPolicy(model, tok, name="bench", max_batch_size=args.rollouts, seed=0)
    rollouts = run_local(policy, [task], args.rollouts, limits, args.rollouts)[task.task_ref]
    policy.clear_cache()
    pad = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    batch = collate(rollouts, pad)
    lengths = [len(r.token_ids) for r in rollouts]
    opening = loop.shared_opening(batch.input_ids, batch.attention_mask)
    progress(f"{len(rollouts)} rollouts of {min(lengths)}-{max(lengths)} tokens, shared opening {opening} tokens")

    _, (lp_shared, g_shared) = one_pass(model, batch, params, shared=True)
    _, (lp_rows, g_rows) = one_pass(model, batch, params, shared=False)
    valid = batch.agent_mask.bool()
    logp_diff = float((lp_shared - lp_rows)[valid].abs().max())
    grad_rel = max(float((a - b).norm() / b.norm().clamp(min=1e-12)) for a, b in zip(g_shared, g_rows, strict=True))
    progress(f"checked: max |log-prob diff| {logp_diff:.2e}, max relative gradient diff {grad_rel:.2e}")

    times: dict[str, list[float]] = {"shared": [], "rows": []}
    for i in range(args.repeats):
        for way in ("shared", "rows") if i % 2 == 0 else ("rows", "shared"):
            took, _ = one_pass(model, batch, params, shared=way == "shared")
            times[way].append(took)
            progress(f"repeat {i}: {way} {took:.1f} s")
    tokens = int(batch.attention_mask.sum())
    result = {
        "model": model_dir.name,
        "rollouts": len(rollouts),
        "tokens": tokens,
        "lengths": lengths,
        "shared_opening_tokens": opening,
        "logprob_max_abs_diff": logp_diff,
        "grad_max_rel_diff": grad_rel,
        "shared_s": round(statistics.median(times["shared"]), 2),
        "rows_s": round(statistics.median(times["rows"]), 2),
    }
    result["speedup"] = round(result["rows_s"] / result["shared_s"], 2)
    if not args.json:
        print(
            f"forward+backward of {tokens} tokens: shared opening {result['shared_s']} s,"
            f" every row whole {result['rows_s']} s; speedup {result['speedup']}x"
        )
    if args.write_docs:
        cmd = "python bench/shared_opening.py" + "".join(f" {a}" for a in sys.argv[1:] if a != "--write-docs")
        write_section(
            "shared_opening",
            f"""
## Shared opening in the learner's forward (`bench/shared_opening.py`)

`{cmd}`

On {machine()}; model `{result["model"]}` (fp32, LoRA r16 on all 7 projections). One micro-batch of
{result["rollouts"]} sampled rollouts of one train task ({min(lengths)}-{max(lengths)} tokens, {tokens} in all),
of which the first {opening} tokens (system prompt, worked example, instruction) are the same in every rollout.
Forward and backward of the update's loss, median of {args.repeats} alternating passes:

| | seconds |
|---|---|
| opening run once, shared | {result["shared_s"]} |
| every row whole | {result["rows_s"]} |

Speedup {result["speedup"]}x. Both ways give the same log-probs (max
difference {logp_diff:.1e}) and LoRA gradients (max relative difference {grad_rel:.1e}).
""",
        )
    emit(result)


if __name__ == "__main__":
    main()
