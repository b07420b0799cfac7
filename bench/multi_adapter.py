"""Episodes of several tenants on different adapters served side by side: tokens/s of 8 concurrent episodes
on 4 adapters vs 8 on one adapter, in one run, and what each extra adapter held costs in memory.

    python bench/multi_adapter.py [--quick] [--model DIR] [--episodes 8] [--adapters 4] [--turns T]
        [--max-new-tokens N] [--rounds R] [--json] [--write-docs]

Six arms over the same built-in train tasks, through the real episode loop (`run_episodes`, one batched
generate call per round), sampling at temperature 1.0:
- `single`: every episode on one adapter;
- `mixed`: the episodes spread over the adapters, decoded in one batch, each layer's adapters stacked
  (`agentloop/policy/mixed_lora.py`; `AGENTLOOP_MIXED_ADAPTER_BATCHES=true`, the default);
- `peft_mixed`: the same batch through PEFT's own mixed-adapter forward (`adapter_names=`);
- `grouped`: the same spread, one batch per adapter one after another (`...=false`);
- `single_warm`, `mixed_warm`: `single` and `mixed` in the steady state of a service that has served these
  tenants before: each adapter's opening (the system prompt and worked example every episode starts with)
  is in the prefix cache when the episodes arrive. Cold, the mixed batch prefills that opening once per
  adapter where the single batch does it once.
Adapters are random LoRA weights with the learner's LoRA config (`LoopConfig`). The arms alternate for
`--rounds` rounds (each with the prefix cache cleared, the warm arms' primed again untimed) so machine noise
hits them alike; tokens/s is all generated tokens over the loop's wall time, median over rounds. Memory: the
process's resident set before and after loading each adapter, and the adapter's own parameter bytes.
Last line: a JSON object with `multi_single_tps_ratio` (mixed_warm over single_warm: the steady state),
`multi_single_tps_ratio_cold` (mixed over single, both from an empty cache) and `grouped_single_tps_ratio`.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

from agentloop.agent.episode import Episode, Limits, run_episodes
from agentloop.agent.prompt import ChatFormat
from agentloop.apps.builtin import BUILTIN
from agentloop.learner.config import LoopConfig
from agentloop.learner.model import lora_model
from agentloop.policy.local import LocalPolicy
from agentloop.policy.models import load_model_and_tokenizer, resolve_model_dir
from agentloop.settings import get_settings

from report import emit, machine, write_section

SECTION = "multi_adapter"
PRIMER = Limits(max_turns=1, max_new_tokens=1)


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def save_adapters(model_dir: Path, n: int, root: Path) -> tuple[list[Path], float]:
    """`n` adapters with random weights (the learner's LoRA shape); their paths and one's parameter MB. Run
    in a child process, so that the memory of the models built here does not hide the adapters' growth."""
    from transformers import AutoModelForCausalLM

    paths = []
    megabytes = 0.0
    for i in range(n):
        torch.manual_seed(100 + i)
        model = lora_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), LoopConfig(), None)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.data.normal_(0, 0.02)  # a trained adapter, not the identity
        megabytes = sum(p.numel() * p.element_size() for n_, p in model.named_parameters() if "lora_" in n_) / 2**20
        path = root / f"adapter{i}"
        model.save_pretrained(path)
        paths.append(path)
        del model
    return paths, megabytes


def run_arm(
    policy: LocalPolicy, fmt: ChatFormat, refs: list[str], adapters: list[str], limits: Limits, arm: str
) -> dict[str, float]:
    """The arm's episodes through the loop, timed. A `..._warm` arm first (untimed) runs one 1-token episode
    on each of its adapters, so that each adapter's opening (system prompt, worked example) is cached, as in
    a service that has served those tenants before; the other arms start from an empty prefix cache."""
    policy.clear_cache()
    policy.mixed_adapter_batches = arm != "grouped"
    policy.stacked_lora = arm != "peft_mixed"
    if arm.endswith("_warm"):
        primers = [
            Episode(BUILTIN.task_world(refs[0]), fmt, BUILTIN.task(refs[0]).instruction, PRIMER, adapter=a, key=f"p{a}")
            for a in dict.fromkeys(adapters)
        ]
        run_episodes(policy, primers)
    episodes = [
        Episode(BUILTIN.task_world(ref), fmt, BUILTIN.task(ref).instruction, limits, adapter=a, key=f"{arm}-{i}")
        for i, (ref, a) in enumerate(zip(refs, adapters, strict=True))
    ]
    t0 = time.perf_counter()
    run_episodes(policy, episodes)
    seconds = time.perf_counter() - t0
    tokens = sum(len(t.output_token_ids) for ep in episodes for t in ep.turns)
    return {"seconds": seconds, "tokens": tokens, "tps": tokens / seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 turn of 16 tokens, 1 round")
    ap.add_argument("--model", default=None, help="model name or directory (default: AGENTLOOP_MODEL)")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--turns", type=int, default=None, help="turns per episode (default 3)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="new tokens per turn (default 64)")
    ap.add_argument("--rounds", type=int, default=None, help="alternating rounds of the four arms (default 3)")
    ap.add_argument("--json", action="store_true", help="print only the JSON object")
    ap.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    args = ap.parse_args()
    turns = args.turns or (1 if args.quick else 3)
    new_tokens = args.max_new_tokens or (16 if args.quick else 64)
    rounds = args.rounds or (1 if args.quick else 3)
    if args.episodes < args.adapters or args.adapters < 2:
        ap.error("need at least 2 adapters and at least as many episodes as adapters")

    settings = get_settings()
    model_dir = resolve_model_dir(args.model or settings.model, settings.models_dir)
    limits = Limits(max_turns=turns, max_new_tokens=new_tokens, temperature=1.0)
    train = [t.id for t in BUILTIN.tasks("train")]
    refs = train[:: max(1, len(train) // args.episodes)][: args.episodes]
    with tempfile.TemporaryDirectory() as tmp:
        progress(f"saving {args.adapters} adapters ...")
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:
            paths, adapter_mb = child.submit(save_adapters, model_dir, args.adapters, Path(tmp)).result()
        model, tok = load_model_and_tokenizer(model_dir, "float32", "cpu")
        policy = LocalPolicy(model, tok, name=model_dir.name, seed=0, max_batch_size=max(16, args.episodes))
        fmt = ChatFormat(tok)
        names = [f"a{i}" for i in range(args.adapters)]
        rss = [rss_mb()]
        for name, path in zip(names, paths, strict=True):
            policy.load_adapter(name, str(path))
            rss.append(rss_mb())
        per_adapter_rss = [round(b - a, 1) for a, b in itertools.pairwise(rss)]
        spread = [names[i % args.adapters] for i in range(args.episodes)]
        plans = {
            "single": [names[0]] * args.episodes,
            "mixed": spread,
            "peft_mixed": spread,
            "grouped": spread,
            "single_warm": [names[0]] * args.episodes,
            "mixed_warm": spread,
        }
        progress("warm-up ...")
        run_arm(policy, fmt, refs[:2], names[:2], Limits(max_turns=1, max_new_tokens=4), "mixed")
        results: dict[str, list[dict[str, float]]] = {arm: [] for arm in plans}
        for r in range(rounds):
            order = list(plans) if r % 2 == 0 else list(reversed(plans))
            for arm in order:
                out = run_arm(policy, fmt, refs, plans[arm], limits, arm)
                results[arm].append(out)
                progress(f"round {r + 1}/{rounds} {arm}: {out['tokens']} tokens in {out['seconds']:.1f} s")
    tps = {arm: statistics.median(o["tps"] for o in outs) for arm, outs in results.items()}
    result: dict[str, Any] = {
        "model": model_dir.name,
        "quick": args.quick,
        "episodes": args.episodes,
        "adapters": args.adapters,
        "turns": turns,
        "max_new_tokens": new_tokens,
        "rounds": rounds,
        "single_tps": round(tps["single"], 1),
        "mixed_tps": round(tps["mixed"], 1),
        "grouped_tps": round(tps["grouped"], 1),
        "peft_mixed_tps": round(tps["peft_mixed"], 1),
        "single_warm_tps": round(tps["single_warm"], 1),
        "mixed_warm_tps": round(tps["mixed_warm"], 1),
        "peft_mixed_single_tps_ratio": round(tps["peft_mixed"] / tps["single"], 3),
        "multi_single_tps_ratio": round(tps["mixed_warm"] / tps["single_warm"], 3),
        "multi_single_tps_ratio_cold": round(tps["mixed"] / tps["single"], 3),
        "grouped_single_tps_ratio": round(tps["grouped"] / tps["single"], 3),
        "adapter_param_mb": round(adapter_mb, 2),
        "rss_per_adapter_mb": per_adapter_rss,
        "rss_per_extra_adapter_mb": round(statistics.median(per_adapter_rss[1:] or per_adapter_rss), 1),
        "tokens": {arm: [o["tokens"] for o in outs] for arm, outs in results.items()},
    }
    if not args.json:
        print(
            f"single {result['single_tps']} tok/s, mixed {result['mixed_tps']} "
            f"({result['multi_single_tps_ratio_cold']}x); "
            f"warm: single {result['single_warm_tps']}, mixed {result['mixed_warm_tps']} "
            f"({result['multi_single_tps_ratio']}x); "
            f"grouped {result['grouped_tps']} ({result['grouped_single_tps_ratio']}x); "
            f"{result['adapter_param_mb']} MB of weights per adapter, RSS +{per_adapter_rss} MB"
        )
    if args.write_docs:
        cmd = "python bench/multi_adapter.py" + (" --quick" if args.quick else "")
        cmd += f" --rounds {args.rounds}" if args.rounds else ""
        n, k = args.episodes, args.adapters
        rows = "\n".join(
            [
                f"| {n} episodes on 1 adapter, opening cached | {result['single_warm_tps']} | 1.0 |",
                f"| {n} on {k} adapters, one mixed batch (default), openings cached | {result['mixed_warm_tps']} | "
                f"{result['multi_single_tps_ratio']} |",
                f"| {n} episodes on 1 adapter, empty cache | {result['single_tps']} | 1.0 |",
                f"| {n} on {k} adapters, one mixed batch (default), empty cache | {result['mixed_tps']} | "
                f"{result['multi_single_tps_ratio_cold']} |",
                f"| {n} on {k} adapters, one batch, PEFT's `adapter_names` | {result['peft_mixed_tps']} | "
                f"{result['peft_mixed_single_tps_ratio']} |",
                f"| {n} on {k} adapters, one batch per adapter | {result['grouped_tps']} | "
                f"{result['grouped_single_tps_ratio']} |",
            ]
        )
        write_section(
            SECTION,
            f"""## Tenants' adapters side by side (`bench/multi_adapter.py`)

`{cmd}` on {machine()}; model `{model_dir.name}`, fp32; {args.episodes} concurrent episodes of built-in train
tasks, {turns} turns of at most {new_tokens} new tokens, temperature 1.0, through the episode loop; median of
{rounds} alternating rounds. Adapters: random weights in the learner's LoRA shape (`LoopConfig`).

Two starting states: "openings cached" is a service that has served these tenants before (each adapter's
opening, the system prompt and worked example, is in the prefix cache); "empty cache" is the first batch
after a start or a weight change, where the mixed batch prefills that opening once per adapter and the
single batch once. The PEFT and per-adapter rows start from an empty cache: compare them with the row
above them.

| arm | tokens/s | vs one adapter |
|---|---|---|
{rows}

Memory per adapter held: {result["adapter_param_mb"]} MB of LoRA weights; the process's resident set grew by
{per_adapter_rss} MB as each was loaded. `multi_single_tps_ratio` (openings cached) =
{result["multi_single_tps_ratio"]}, `multi_single_tps_ratio_cold` = {result["multi_single_tps_ratio_cold"]}
(target ≥ 0.8).""",
        )
    emit(result)


if __name__ == "__main__":
    main()
