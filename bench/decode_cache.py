"""A decode step over a long cache: transformers' DynamicCache (concatenates every layer's keys/values at
every token) vs the local policy's cache with room (`agentloop/policy/kv.py`: each token written into its slot).

    python bench/decode_cache.py [--quick] [--rows B] [--contexts 1000,3000] [--steps T] [--model DIR] [--json]
        [--write-docs]

What LocalPolicy's decode loop does after the prefill: B rows, each with a cache of L tokens (an episode's
turn deep into its context: the built-in world's prompts are 1-4k tokens), T greedy steps of one token per
row with the attention mask growing by one. The cache's contents do not change the cost, so it is filled with
random keys/values instead of a prefill. The two layouts alternate, 3 rounds each; the median seconds per step
of each, their ratio and decoded tokens/s are reported per context length, and both layouts' logits are checked
equal. Last line: a JSON object with `concat_room_step_ratio` (at the longest context).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from transformers import DynamicCache

from agentloop.policy.kv import with_room
from agentloop.policy.models import load_model_and_tokenizer, output_cache, resolve_model_dir
from agentloop.settings import get_settings

from report import emit, machine, write_section

SECTION = "decode_cache"


def decode(model: Any, cache: Any, rows: int, length: int, steps: int) -> tuple[float, torch.Tensor]:
    """`steps` one-token steps over `cache` (rows x length tokens); seconds per step and the last logits."""
    mask = torch.ones((rows, length), dtype=torch.long)
    tok = torch.zeros((rows, 1), dtype=torch.long)
    pos = torch.full((rows, 1), length)
    t0 = time.perf_counter()
    for _ in range(steps):
        mask = torch.cat([mask, torch.ones((rows, 1), dtype=torch.long)], dim=-1)
        out = model(input_ids=tok, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
        cache, pos = output_cache(out), pos + 1
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
    return (time.perf_counter() - t0) / steps, out.logits[:, -1]


def measure(model: Any, rows: int, length: int, steps: int, rounds: int) -> dict[str, Any]:
    cfg = model.config
    heads = cfg.num_key_value_heads
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    gen = torch.Generator().manual_seed(length)
    kv = [
        (torch.randn(rows, heads, length, dim, generator=gen), torch.randn(rows, heads, length, dim, generator=gen))
        for _ in range(cfg.num_hidden_layers)
    ]
    times: dict[str, list[float]] = {"concat": [], "room": []}
    last: dict[str, torch.Tensor] = {}
    with torch.inference_mode():
        for _ in range(rounds):
            for layout in ("concat", "room"):
                cache = DynamicCache(ddp_cache_data=kv)
                if layout == "room":
                    cache = with_room(cache, steps)
                took, last[layout] = decode(model, cache, rows, length, steps)
                times[layout].append(took)
    concat, room = statistics.median(times["concat"]), statistics.median(times["room"])
    return {
        "rows": rows,
        "context": length,
        "steps": steps,
        "concat_s_per_step": round(concat, 4),
        "room_s_per_step": round(room, 4),
        "concat_room_step_ratio": round(concat / room, 3),
        "room_tokens_per_s": round(rows / room, 1),
        "concat_tokens_per_s": round(rows / concat, 1),
        "max_logit_diff": float((last["concat"] - last["room"]).abs().max()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="4 rows, a 256-token context, 4 steps")
    ap.add_argument("--rows", type=int, default=None, help="rows decoded together (default 16: max_batch_size)")
    ap.add_argument("--contexts", default=None, help="comma-separated cache lengths (default 1000,3000)")
    ap.add_argument("--steps", type=int, default=None, help="decode steps per measurement (default 24)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    rows = args.rows or (4 if args.quick else 16)
    contexts = [int(c) for c in (args.contexts or ("256" if args.quick else "1000,3000")).split(",")]
    steps = args.steps or (4 if args.quick else 24)
    settings = get_settings()
    model_dir = resolve_model_dir(args.model or settings.model, settings.models_dir)
    model, _ = load_model_and_tokenizer(model_dir, "float32", "cpu")
    model.eval()
    results = [measure(model, rows, n, steps, 1 if args.quick else args.rounds) for n in contexts]
    if not args.json:
        for r in results:
            print(
                f"{r['rows']} rows x {r['context']} cached tokens: concat {r['concat_s_per_step']} s/step, room "
                f"{r['room_s_per_step']} s/step ({r['concat_room_step_ratio']}x); max logit diff {r['max_logit_diff']}"
            )
    if args.write_docs:
        table = "\n".join(
            f"| {r['rows']} | {r['context']} | {r['concat_s_per_step']} | {r['room_s_per_step']} | "
            f"{r['concat_room_step_ratio']}x | {r['concat_tokens_per_s']} → {r['room_tokens_per_s']} |"
            for r in results
        )
        write_section(
            SECTION,
            f"""## Decode over a long cache: concatenated vs written in place (`bench/decode_cache.py`)

`python bench/decode_cache.py` on {machine()}; model `{model_dir.name}`, fp32. One-token greedy steps over a cache
of the given length per row (random keys/values: the contents do not change the cost), as LocalPolicy's decode
loop runs after a prefill; median of {args.rounds} alternating rounds of {steps} steps each.

| rows | cached tokens | concat s/step | in place s/step | speedup | tokens/s |
|---|---|---|---|---|---|
{table}

transformers' DynamicCache appends each step's keys/values with `torch.cat`, copying the whole cache of every
layer at every token; the policy's cache with room (`agentloop/policy/kv.py`) writes one slot. Both give the
same logits (max difference {max(r["max_logit_diff"] for r in results):.1e}).""",
        )
    emit({"model": model_dir.name, "quick": args.quick, **results[-1], "runs": results})


if __name__ == "__main__":
    main()
