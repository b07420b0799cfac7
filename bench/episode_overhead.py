"""Episode-loop overhead: tokens/s of full served episodes (sampling, parsing, world calls, step
persistence) vs. `model.generate` alone on the same prompts and lengths, in one run.

    python bench/episode_overhead.py [--quick] [--model smollm2-135m-instruct] [--write-docs]

Each turn the loop ran is replayed through `model.generate` with the same context and the same
number of new tokens (min_new_tokens = max_new_tokens); the two are interleaved, task by task, so
machine noise hits both alike. Last line: a JSON object with `loop_generate_tps_ratio`.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from agentloop.agent.episode import Episode, Limits, Turn, run_episodes
from agentloop.agent.prompt import ChatFormat
from agentloop.apps.builtin import BUILTIN
from agentloop.policy.local import LocalPolicy
from agentloop.policy.models import load_model_and_tokenizer, resolve_model_dir
from agentloop.settings import get_settings

from report import emit, machine, write_section


@dataclass
class Tally:
    seconds: float = 0.0
    tokens: int = 0
    gen_seconds: float = 0.0
    turns: list[tuple[list[int], int]] = field(default_factory=list)  # (context, new tokens)

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def persist_to_sqlite(db: Path):
    """The loop's on_turn: store each step as the service does (one transaction per step)."""
    from sqlalchemy.orm import sessionmaker

    from agentloop.store import episodes as episode_store
    from agentloop.store.db import make_engine
    from agentloop.store.migrate import upgrade
    from agentloop.store.models import Episode as EpisodeRow

    url = f"sqlite:///{db}"
    upgrade(url)
    Session = sessionmaker(bind=make_engine(url))
    rows: dict[int, tuple[Episode, str]] = {}  # keeps the episode alive so its id() is not reused

    def on_turn(ep: Episode, turn: Turn) -> None:
        with Session.begin() as s:
            if id(ep) not in rows:
                row = EpisodeRow(
                    world="builtin", instruction=ep.instruction, policy="bench", prompt_token_ids=ep.prompt_token_ids
                )
                s.add(row)
                s.flush()
                rows[id(ep)] = (ep, row.id)
            episode_store.add_step(s, rows[id(ep)][1], turn)

    return on_turn


def run_loop(policy: LocalPolicy, fmt: ChatFormat, task_ref: str, limits: Limits, on_turn, tally: Tally) -> None:
    task = BUILTIN.task(task_ref)
    ep = Episode(BUILTIN.task_world(task_ref), fmt, task.instruction, limits, key=task_ref)
    t0 = time.perf_counter()
    run_episodes(policy, [ep], on_turn=on_turn)
    tally.seconds += time.perf_counter() - t0
    for turn in ep.turns:
        tally.tokens += len(turn.output_token_ids)
        tally.gen_seconds += turn.gen_s
        tally.turns.append((ep.context[: turn.prompt_token_count], len(turn.output_token_ids)))


@torch.inference_mode()
def run_generate(model, turns: list[tuple[list[int], int]], temperature: float, tally: Tally) -> None:
    for context, n in turns:
        ids = torch.tensor([context])
        t0 = time.perf_counter()
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=True,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            pad_token_id=model.config.eos_token_id,
        )
        tally.seconds += time.perf_counter() - t0
        tally.tokens += out.shape[1] - ids.shape[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 tasks, 3 turns, 48 tokens per turn")
    ap.add_argument("--model", default=None, help="model name or directory (default: AGENTLOOP_MODEL)")
    ap.add_argument("--tasks", type=int, default=None)
    ap.add_argument("--turns", type=int, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    args = ap.parse_args()

    settings = get_settings()
    n_tasks = args.tasks or (2 if args.quick else 6)
    limits = Limits(
        max_turns=args.turns or (3 if args.quick else 6),
        max_new_tokens=args.max_new_tokens or (48 if args.quick else 128),
        temperature=1.0,
    )
    model_dir = resolve_model_dir(args.model or settings.model, settings.models_dir)
    model, tok = load_model_and_tokenizer(model_dir, settings.model_dtype, settings.device)
    policy = LocalPolicy(model, tok, name=str(model_dir), seed=0)
    fmt = ChatFormat(tok)
    refs = [t.id for t in BUILTIN.tasks("train")][:: max(1, len(BUILTIN.tasks("train")) // n_tasks)][:n_tasks]

    loop, gen = Tally(), Tally()
    with tempfile.TemporaryDirectory() as tmp:
        on_turn = persist_to_sqlite(Path(tmp) / "bench.db")
        run_loop(policy, fmt, refs[0], Limits(max_turns=1, max_new_tokens=8), on_turn, Tally())  # warm-up
        run_generate(model, [(fmt.opening("warm", "up"), 8)], 1.0, Tally())
        for ref in refs:  # interleaved: each task's turns through the loop, then through generate
            before = len(loop.turns)
            run_loop(policy, fmt, ref, limits, on_turn, loop)
            run_generate(model, loop.turns[before:], limits.temperature, gen)

    ratio = loop.tps / gen.tps
    result = {
        "loop_generate_tps_ratio": round(ratio, 3),
        "loop_tps": round(loop.tps, 2),
        "generate_tps": round(gen.tps, 2),
        "loop_overhead_frac": round(1 - loop.gen_seconds / loop.seconds, 4),
        "turns": len(loop.turns),
        "tokens": loop.tokens,
        "mean_context_tokens": round(sum(len(c) for c, _ in loop.turns) / len(loop.turns)),
        "model": Path(model_dir).name,
        "quick": args.quick,
    }
    if args.write_docs:
        cmd = "python bench/episode_overhead.py" + (" --quick" if args.quick else "")
        write_section(
            "episode_overhead",
            f"""
## Episode-loop overhead (`bench/episode_overhead.py`)

`{cmd}` on {machine()}; model `{result["model"]}`, {len(refs)} built-in train tasks, {result["turns"]} turns,
{result["tokens"]} generated tokens, mean context {result["mean_context_tokens"]} tokens, temperature 1.0, batch 1.

| path | tokens/s |
|---|---|
| `model.generate` alone, same contexts and lengths | {result["generate_tps"]} |
| full episode loop (sample, parse, world call, observation, step persisted to SQLite) | {result["loop_tps"]} |
| **ratio loop / generate** (`loop_generate_tps_ratio`, target >= 0.85) | **{result["loop_generate_tps_ratio"]}** |

Time in the loop outside sampling (parse, world, tokenise, persist): {result["loop_overhead_frac"] * 100:.2f}%.
The loop samples with its own decode loop (KV cache, log-prob of each drawn token); a ratio above 1 means
that sampler is faster than `generate` at batch 1, not that the loop is free.
""",
        )
    emit(result)


if __name__ == "__main__":
    main()
