"""Inference as a service: tokens/s of concurrent episodes through `agentloop inference` (the `remote` backend,
over HTTP, continuous batching) vs the in-process backend, in one run, and the sampler-vs-learner log-prob gap.

    python bench/inference_server.py [--quick] [--model DIR] [--episodes 8] [--adapters 4] [--turns T]
        [--max-new-tokens N] [--rounds R] [--temperature T] [--device cpu|cuda] [--json] [--write-docs]

Four arms over the same built-in train tasks, through the real episode loop (`run_episodes`: each round of
turns is one generate call of every running episode), greedy (`--temperature 0`, the default), so that both
backends generate the same tokens and do the same work (sampled, turns of different lengths make tokens/s
differ between arms by more than the backends do):
- `inprocess`: `LocalPolicy` in this process (leader/follower batching, per-episode prefix cache);
- `server`: `RemotePolicy` to an `agentloop inference` process on the same machine (each turn one HTTP
  request; the server decodes them in one continuous batch, reusing finished turns' keys/values);
- `inprocess_mixed`, `server_mixed`: the same with the episodes spread over `--adapters` adapters (random
  weights in the learner's LoRA shape), decoded in one batch.
Both backends start warm (one untimed round: a service that has served these tasks before), and the arms
alternate for `--rounds` rounds so machine noise hits them alike; tokens/s is generated tokens over the
loop's wall time, median over rounds. The two processes never compute at once: while the server decodes,
this process waits on its sockets.

Log-prob gap: every token the server sampled, scored again by this process's copy of the model (one
teacher-forced forward per episode, each on its adapter, as the learner recomputes pi_old): mean |delta| per
token. Last line: a JSON object with `server_inprocess_tps_ratio`, `mixed_adapters_tps_ratio` (server over
in-process, both mixed) and `logprob_gap`.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import torch
from multi_adapter import save_adapters

from agentloop.agent.episode import Episode, Limits, run_episodes
from agentloop.agent.prompt import ChatFormat
from agentloop.apps.builtin import BUILTIN
from agentloop.policy.local import LocalPolicy
from agentloop.policy.models import load_model_and_tokenizer, resolve_model_dir
from agentloop.policy.remote import RemotePolicy
from agentloop.policy.server import start_process
from agentloop.settings import get_settings

from report import emit, machine, write_section

SECTION = "inference_server"


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_arm(policy: Any, fmt: ChatFormat, refs: list[str], adapters: list[str | None], limits: Limits, tag: str):
    episodes = [
        Episode(BUILTIN.task_world(ref), fmt, BUILTIN.task(ref).instruction, limits, adapter=a, key=f"{tag}-{i}")
        for i, (ref, a) in enumerate(zip(refs, adapters, strict=True))
    ]
    t0 = time.perf_counter()
    run_episodes(policy, episodes)
    seconds = time.perf_counter() - t0
    tokens = sum(len(t.output_token_ids) for ep in episodes for t in ep.turns)
    return {"seconds": seconds, "tokens": tokens, "tps": tokens / seconds}, episodes


@torch.inference_mode()
def logprob_gap(
    policy: LocalPolicy, episodes: list[Episode], names: dict[str, str], temperature: float
) -> tuple[float, float, int]:
    """Mean and max |sampler log-prob - teacher-forced log-prob| over every sampled token, and the count."""
    deltas: list[float] = []
    model = policy.model
    for ep in episodes:
        if not ep.turns:
            continue
        last = ep.turns[-1]
        end = last.prompt_token_count + len(last.output_token_ids)
        ids = torch.tensor([ep.context[:end]], device=model.device)
        if ep.adapter is None:
            with model.disable_adapter():
                logits = model(input_ids=ids).logits[0].float()
        else:
            model.set_adapter(names[ep.adapter])
            logits = model(input_ids=ids).logits[0].float()
        logp = torch.log_softmax(logits / (temperature or 1.0), -1)
        for turn in ep.turns:
            for i, (tok, sampled) in enumerate(zip(turn.output_token_ids, turn.output_logprobs or [], strict=True)):
                deltas.append(abs(sampled - logp[turn.prompt_token_count - 1 + i, tok].item()))
    return statistics.fmean(deltas), max(deltas), len(deltas)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 turn of 16 tokens, 1 round")
    ap.add_argument("--model", default=None, help="model name or directory (default: AGENTLOOP_MODEL)")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--turns", type=int, default=None, help="turns per episode (default 3)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="new tokens per turn (default 64)")
    ap.add_argument("--rounds", type=int, default=None, help="alternating rounds of the four arms (default 3)")
    ap.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (both processes)")
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
    limits = Limits(max_turns=turns, max_new_tokens=new_tokens, temperature=args.temperature)
    train = [t.id for t in BUILTIN.tasks("train")]
    refs = train[:: max(1, len(train) // args.episodes)][: args.episodes]
    with tempfile.TemporaryDirectory() as tmp:
        progress(f"saving {args.adapters} adapters ...")
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:
            paths, _ = child.submit(save_adapters, model_dir, args.adapters, Path(tmp)).result()
        progress("starting agentloop inference ...")
        proc, url = start_process(
            model_dir,
            Path(tmp) / "server.log",
            "--max-rows",
            str(max(16, args.episodes)),
            env={"AGENTLOOP_DEVICE": args.device, "AGENTLOOP_TORCH_THREADS": str(torch.get_num_threads())},
        )
        try:
            model, tok = load_model_and_tokenizer(model_dir, "float32", args.device)
            local = LocalPolicy(model, tok, name=model_dir.name, seed=0, max_batch_size=max(16, args.episodes))
            remote = RemotePolicy([url], tok, name=model_dir.name, timeout_s=600)
            fmt = ChatFormat(tok)
            names = [f"{model_dir.name}@v{i + 1}" for i in range(args.adapters)]
            for name, path in zip(names, paths, strict=True):
                local.load_adapter(name, str(path))
                remote.load_adapter(name, str(path))
            spread: list[str | None] = [names[i % args.adapters] for i in range(args.episodes)]
            base: list[str | None] = [None] * args.episodes
            arms = {
                "inprocess": (local, base),
                "server": (remote, base),
                "inprocess_mixed": (local, spread),
                "server_mixed": (remote, spread),
            }
            progress("warm-up (untimed) ...")
            for arm, (policy, plan) in arms.items():
                run_arm(policy, fmt, refs, plan, limits, f"warm-{arm}")
            results: dict[str, list[dict[str, float]]] = {arm: [] for arm in arms}
            sampled: list[Episode] = []
            for r in range(rounds):
                order = list(arms) if r % 2 == 0 else list(reversed(arms))
                for arm in order:
                    policy, plan = arms[arm]
                    out, episodes = run_arm(policy, fmt, refs, plan, limits, f"{arm}-{r}")
                    results[arm].append(out)
                    if arm.startswith("server"):
                        sampled += episodes
                    progress(f"round {r + 1}/{rounds} {arm}: {out['tokens']} tokens in {out['seconds']:.1f} s")
            stats = httpx.get(f"{url}/stats").json()
            gap, gap_max, scored = logprob_gap(local, sampled, {n: n for n in names}, args.temperature)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    tps = {arm: statistics.median(o["tps"] for o in outs) for arm, outs in results.items()}
    result: dict[str, Any] = {
        "model": model_dir.name,
        "device": args.device,
        "quick": args.quick,
        "episodes": args.episodes,
        "adapters": args.adapters,
        "turns": turns,
        "max_new_tokens": new_tokens,
        "rounds": rounds,
        "temperature": args.temperature,
        **{f"{arm}_tps": round(v, 1) for arm, v in tps.items()},
        "server_inprocess_tps_ratio": round(tps["server"] / tps["inprocess"], 3),
        "mixed_adapters_tps_ratio": round(tps["server_mixed"] / tps["inprocess_mixed"], 3),
        "logprob_gap": float(f"{gap:.3g}"),
        "logprob_gap_max": float(f"{gap_max:.3g}"),
        "tokens_scored": scored,
        "server_most_rows": stats["most_rows"],
        "server_joined_running": stats["joined_running"],
        "server_prefix_hits": stats["prefix_hits"],
        "tokens": {arm: [o["tokens"] for o in outs] for arm, outs in results.items()},
    }
    if not args.json:
        print(
            f"in-process {result['inprocess_tps']} tok/s, server {result['server_tps']} "
            f"({result['server_inprocess_tps_ratio']}x); mixed: in-process {result['inprocess_mixed_tps']}, "
            f"server {result['server_mixed_tps']} ({result['mixed_adapters_tps_ratio']}x); "
            f"log-prob gap {result['logprob_gap']} (max {result['logprob_gap_max']}) over {scored} tokens"
        )
    if args.write_docs:
        cmd = "python bench/inference_server.py" + (" --quick" if args.quick else "")
        cmd += f" --rounds {args.rounds}" if args.rounds else ""
        cmd += f" --temperature {args.temperature}" if args.temperature else ""
        cmd += f" --device {args.device}" if args.device != "cpu" else ""
        n, k = args.episodes, args.adapters
        write_section(
            SECTION if args.device == "cpu" else f"{SECTION}_{args.device}",
            f"""## Inference as a service: `agentloop inference` vs in-process (`bench/inference_server.py`)

`{cmd}` on {machine()}, device `{args.device}`; model `{model_dir.name}`, fp32; {n} concurrent episodes of
built-in train tasks, {turns} turns of at most {new_tokens} new tokens, temperature {args.temperature}
({"greedy: both backends generate the same tokens" if not args.temperature else "sampled"}), through the episode loop;
median of {rounds} alternating rounds after an untimed warm-up. The server is a second process on the same
machine, reached over HTTP on localhost.

| arm | tokens/s | server / in-process |
|---|---|---|
| in-process, base model | {result["inprocess_tps"]} | |
| `agentloop inference`, base model | {result["server_tps"]} | {result["server_inprocess_tps_ratio"]} |
| in-process, {k} adapters mixed | {result["inprocess_mixed_tps"]} | |
| `agentloop inference`, {k} adapters mixed | {result["server_mixed_tps"]} | {result["mixed_adapters_tps_ratio"]} |

Sampler vs learner: over {scored} tokens the server sampled, |log-prob - teacher-forced log-prob| averages
{result["logprob_gap"]} (max {result["logprob_gap_max"]}). The server's batch held up to
{result["server_most_rows"]} rows; {result["server_joined_running"]} requests joined a batch already decoding;
{result["server_prefix_hits"]} prefills started from a kept prefix. `server_inprocess_tps_ratio` =
{result["server_inprocess_tps_ratio"]}, `mixed_adapters_tps_ratio` = {result["mixed_adapters_tps_ratio"]}
(target ≥ 0.9).""",
        )
    emit(result)


if __name__ == "__main__":
    main()
