"""Where a model's greedy action leaves the expert's, at the dev oracle prefixes expert-action agreement
is measured on (the learner's `dev_agreement`: the same episodes, steps and teacher forcing).

For each step the first token where the most likely next token is not the expert's is placed in the
expert call's text: in the app's name, the API's name, an argument's value (which argument), or the
call's syntax around them. Agreement says how often an action is right; this says what is wrong when
it is not: choosing the app or API is planning, an argument value is mostly copying from the context
(a password, a token, an id).

    python bench/divergence.py --adapter warm=bench/results/stepagent_curve/warm_start \
        --adapter sft=bench/results/stepagent_curve/adapters/sft
    python bench/divergence.py --quick      # a smoke run: the base model at 4 prefixes

Prints a table and, as its last line, a JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import stepagent_curve as curve
import torch
from learning_curve import use_home

from agentloop.learner.experts import ExpertStep
from agentloop.learner.loop import greedy_hits
from agentloop.policy.models import resolve_model_dir
from agentloop.settings import get_settings

from report import emit, machine

PLACES = ("agrees", "app", "api", "argument value", "syntax")


def hits(model: Any, tokens: list[int], steps: list[ExpertStep]) -> list[bool]:
    """Teacher forcing over one episode (`loop.greedy_hits`, as the learner's agreement): at each position
    of the steps' actions, whether the most likely next token is the expert's."""
    ids = torch.tensor([tokens])
    targets = torch.zeros((1, len(tokens) - 1), dtype=torch.bool)
    for st in steps:
        targets[0, len(st.prefix) - 1 : len(st.prefix) + len(st.action_tokens) - 1] = True
    with torch.no_grad():
        return greedy_hits(model, ids, torch.ones_like(ids), targets)[0].tolist()


def place(step: ExpertStep, matched: list[bool], tokenizer: Any) -> tuple[str, str | None]:
    """Where greedy decoding at this step first writes a token other than the expert's."""
    p, action = len(step.prefix), step.action_tokens
    k = next((i for i, ok in enumerate(matched[p - 1 : p - 1 + len(action)]) if not ok), None)
    if k is None:
        return "agrees", None
    text = tokenizer.decode(action)
    at = len(tokenizer.decode(action[:k]))  # the character the diverging token starts at
    call = step.call
    spans = [("app", None, f'"app": {json.dumps(call.app)}'), ("api", None, f'"api": {json.dumps(call.api)}')]
    spans += [("argument value", name, f"{json.dumps(name)}: {json.dumps(value)}") for name, value in call.args.items()]
    for where, name, written in spans:
        start = text.find(written)
        if start < 0:
            continue
        value_start = start + written.index(": ") + 2
        if value_start <= at < start + len(written):
            return where, name
    return "syntax", None


def measure(label: str, adapter: Path | None, args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    home = use_home(args.results / "homes" / f"divergence-{label}", model_dir)
    trainer = curve.load_trainer(home, curve.make_config("sft", args), model_dir, adapter, label)
    tokenizer = trainer.tokenizer
    trainer.model.eval()
    t0 = time.perf_counter()
    places: Counter[str] = Counter()
    arguments: Counter[str] = Counter()
    for tokens, steps in trainer._agreement_episodes(args.prefixes):
        matched = hits(trainer.model, tokens[: len(steps[-1].prefix) + len(steps[-1].action_tokens)], steps)
        for step in steps:
            where, name = place(step, matched, tokenizer)
            places[where] += 1
            if name is not None:
                arguments[name] += 1
    curve.release(trainer)
    n = sum(places.values())
    return {
        "adapter": str(adapter) if adapter else None,
        "steps": n,
        "percent": {k: round(100.0 * places[k] / max(n, 1), 1) for k in PLACES},
        "argument_values": dict(arguments.most_common()),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the base model at 4 prefixes")
    ap.add_argument("--model", default=None, help="model name or directory (default: AGENTLOOP_MODEL)")
    ap.add_argument(
        "--adapter",
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="a LoRA adapter directory to measure, with its label (repeatable); the base model is always measured",
    )
    ap.add_argument("--prefixes", type=int, default=48, help="dev oracle steps, as the learner's agreement_prefixes")
    ap.add_argument("--results", type=Path, default=None, help="where the scratch homes go (default: AGENTLOOP_HOME)")
    args = ap.parse_args()
    if args.quick:
        args.prefixes, args.adapter = 4, []
    for spec in args.adapter:
        label, _, path = spec.partition("=")
        if not label or not path or not (Path(path) / "adapter_config.json").exists():
            ap.error(f"--adapter {spec!r}: expected LABEL=DIR with DIR holding adapter_config.json")
    # the options stepagent_curve's config reads, at its defaults (nothing here trains)
    for key, value in vars(curve.parse_args([])).items():
        if not hasattr(args, key):
            setattr(args, key, value)
    return args


def main() -> None:
    args = parse_args()
    settings = get_settings()
    args.results = (args.results or settings.home / "bench" / "divergence").resolve()
    model_dir = resolve_model_dir(args.model or settings.model, settings.models_dir)
    adapters: list[tuple[str, Path | None]] = [("base", None)]
    adapters += [(s.partition("=")[0], Path(s.partition("=")[2]).resolve()) for s in args.adapter]
    measured = {}
    for label, path in adapters:
        measured[label] = measure(label, path, args, model_dir)
        print(f"[divergence] {label}: {measured[label]['percent']}", file=sys.stderr, flush=True)
    print(f"| model | steps | {' | '.join(PLACES)} |")
    print(f"|---|---|{'---|' * len(PLACES)}")
    for label, m in measured.items():
        print(f"| {label} | {m['steps']} | " + " | ".join(f"{m['percent'][k]:.1f}" for k in PLACES) + " |")
    emit({"model": model_dir.name, "quick": args.quick, "machine": machine(), "measured": measured})


if __name__ == "__main__":
    main()
