"""Where the agent's greedy action leaves the expert's: the first diverging field of every expert step, on dev
(scenarios no train task uses) and on fresh train-scenario instances (scenarios training draws from, on seeds
it has not seen), for the base model and each adapter given.

    python bench/agreement_errors.py [--adapter LABEL=DIR ...] [--no-base] [--tasks N] [--quick] [--json]
        [--prompt-example fixed|nearest] [--write-docs]

Every expert episode (the oracle's calls played through the real episode loop, as the learner's agreement
measures them) is run once teacher-forced; at each step the greedy action equals the expert's iff the most
likely token is the expert's at every position of it (learner/loop.py's greedy_hits). Where it is not, the
first position that differs says which field the agent gets wrong first: the call's opening (it writes
something else than a call), the app, the API, an argument's name
(and whether it wanted to close the arguments there, i.e. leave an optional one out), an argument's value
(and whether that value appears verbatim earlier in the episode: a copy from the task or an observation),
or the text around the call. A step agreed token for token is an exact hit; all steps of an episode agreed
is an episode the agent would replay exactly under greedy decoding.

The gap between the two task sets separates what training has not fitted (train instances) from what does
not transfer to unseen scenarios (dev). Last line: a JSON object with each model's per-set agreement and
first-divergence counts. `--prompt-example nearest`: every episode shows its own nearest solved task
(agent/examples.py), as adapters trained that way were, instead of the world's one fixed example.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from agentloop.agent.episode import Limits
from agentloop.agent.eval_runs import eval_task
from agentloop.apps.tasks import ToolCall
from agentloop.learner import experts
from agentloop.learner.loop import decoder_hidden, greedy_tokens
from agentloop.learner.task_source import TaskSource
from agentloop.policy.models import resolve_model_dir
from agentloop.settings import get_settings

from report import emit, machine, models_to_measure, write_section

SECTION = "agreement_errors"
ROWS = 8  # episodes per teacher-forced pass
TRAIN_SEED = 20261202  # the train instances' draw: not the seed any bench or test trains with
LIMITS = Limits(
    max_turns=16,
    max_new_tokens=4096,
    observation_max_tokens=3000,
    max_context_tokens=8192,
    wall_time_s=1e9,
    temperature=0.0,
)


def dev_tasks(n: int | None) -> list[Any]:
    """All dev tasks, or n spread over them (every k-th: each scenario's variants are listed together)."""
    provider = TaskSource(world="builtin", train=[]).provider
    tasks = [eval_task(provider, t) for t in provider.tasks("dev")]
    return tasks if n is None else tasks[:: max(1, len(tasks) // n)][:n]


def train_tasks(n: int) -> list[Any]:
    return TaskSource(world="builtin", train=[]).fresh(random.Random(TRAIN_SEED), n)


def field_spans(text: str, call: ToolCall) -> list[tuple[int, int, str]]:
    """Character spans of the call's parts in its rendered text, in order: (start, end, part), part one of
    "opening" (the text before the app's name), "app", "api", "name:<arg>", "value:<arg>", "end" (from the
    last value on)."""
    spans: list[tuple[int, int, str]] = []
    at = text.find('"app": ')
    api = text.find('"api": ', at)
    args = text.find('"args": {', api)
    if min(at, api, args) < 0:
        return [(0, len(text), "text")]
    app_value = at + len('"app": ')
    spans += [(0, app_value, "opening"), (app_value, api, "app"), (api, args, "api")]
    pos = args + len('"args": {')
    for name, value in call.args.items():
        key = json.dumps(name) + ": "
        k = text.find(key, pos)
        if k < 0:
            return [*spans, (pos, len(text), "end")]
        v = k + len(key)
        end = v + len(json.dumps(value, ensure_ascii=False))
        spans += [(pos, v, f"name:{name}"), (v, end, f"value:{name}")]
        pos = end
    return [*spans, (pos, len(text), "end")]


def part_at(spans: list[tuple[int, int, str]], c: int) -> str:
    return next((part for s, e, part in spans if s <= c < e), "end")


def divergence(tokenizer: Any, step: experts.ExpertStep, predicted: list[int], prefix_text: str) -> dict[str, Any]:
    """The first position of the step where the greedy token is not the expert's, and what it falls in."""
    k = next(i for i, (p, t) in enumerate(zip(predicted, step.action_tokens, strict=True)) if p != t)
    text = tokenizer.decode(step.action_tokens)
    before = len(tokenizer.decode(step.action_tokens[:k]))
    part = part_at(field_spans(text, step.call), before)
    wanted = tokenizer.decode([predicted[k]])
    kind = part.partition(":")[0]
    if kind == "name" and wanted.lstrip().startswith("}"):
        kind = "name (closes the arguments: leaves an optional one out)"
    elif kind == "value":
        value = step.call.args[part.partition(":")[2]]
        shown = json.dumps(value, ensure_ascii=False).strip('"')
        kind = "value (copy of earlier text)" if shown and shown in prefix_text else "value (not in earlier text)"
    elif kind == "end" and wanted.strip().startswith(","):
        kind = "end (wants another argument)"
    return {"kind": kind, "part": part, "api": f"{step.call.app}.{step.call.api}", "wanted": wanted}


@torch.no_grad()
def measure(model: Any, tokenizer: Any, rollouts: list[Any]) -> dict[str, Any]:
    steps_total = hits = episodes_all = 0
    kinds: Counter[str] = Counter()
    by_api: Counter[str] = Counter()
    by_index: dict[int, list[int]] = {}
    weight = model.get_output_embeddings().weight
    for start in range(0, len(rollouts), ROWS):
        part = rollouts[start : start + ROWS]
        length = max(len(r.token_ids) for r in part)
        ids = torch.full((len(part), length), tokenizer.pad_token_id or 0, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for b, r in enumerate(part):
            ids[b, : len(r.token_ids)] = torch.tensor(r.token_ids)
            attn[b, : len(r.token_ids)] = 1
        hidden = decoder_hidden(model.get_decoder(), ids, attn)
        for b, r in enumerate(part):
            steps = experts.expert_steps(r)
            agreed = True
            for st in steps:
                p = len(st.prefix)
                predicted = greedy_tokens(hidden[b, p - 1 : p - 1 + len(st.action_tokens)], weight).tolist()
                hit = predicted == st.action_tokens
                steps_total += 1
                hits += hit
                by_index.setdefault(st.index, [0, 0])
                by_index[st.index][0] += hit
                by_index[st.index][1] += 1
                if not hit:
                    agreed = False
                    d = divergence(tokenizer, st, predicted, tokenizer.decode(st.prefix))
                    kinds[d["kind"]] += 1
                    by_api[d["api"]] += 1
            episodes_all += agreed
    return {
        "episodes": len(rollouts),
        "steps": steps_total,
        "agreement": round(100.0 * hits / max(steps_total, 1), 1),
        "episodes_all_agreed": round(100.0 * episodes_all / max(len(rollouts), 1), 1),
        "first_divergence": dict(kinds.most_common()),
        "missed_apis": dict(by_api.most_common(8)),
        "agreement_by_step": {str(i): round(100.0 * h / n, 1) for i, (h, n) in sorted(by_index.items())},
    }


def load(model_dir: Path, adapter: Path | None) -> Any:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter))
    return model.eval()


def docs_section(result: dict[str, Any], cmd: str) -> str:
    nearest = result["prompt_example"] == "nearest"
    lines = [
        "## Where greedy actions leave the expert's"
        + (", nearest worked examples" if nearest else "")
        + " (`bench/agreement_errors.py`)",
        "",
        f"`{cmd}`",
        "",
        f"On {machine()}; model `{result['model']}`. Expert episodes: the oracle's calls on {result['dev_tasks']} "
        "of the 51 dev tasks, spread over them (dev scenarios: no train task uses them), and on "
        f"{result['train_tasks']} fresh instances of train scenarios (seeds no bench trains on), teacher-forced. A "
        "step counts as agreed when the greedy action is the expert's token for token; an episode when all its "
        "steps are."
        + (
            " Every episode shows its own nearest solved task as its worked example (agent/examples.py)."
            if nearest
            else ""
        ),
        "",
        "| model | set | steps | agreement % | episodes all agreed % | first divergence (steps) |",
        "|---|---|---|---|---|---|",
    ]
    for label, sets in result["models"].items():
        for name, m in sets.items():
            top = ", ".join(f"{k} {v}" for k, v in m["first_divergence"].items())
            lines.append(f"| {label} | {name} | {m['steps']} | {m['agreement']} | {m['episodes_all_agreed']} | {top} |")
    lines += ["", "<details><summary>Full results (JSON)</summary>", "", "```json"]
    lines += [json.dumps(result, indent=1, sort_keys=True), "```", "", "</details>"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--adapter", action="append", default=[], help="LABEL=DIR of a saved LoRA adapter (repeat)")
    ap.add_argument("--no-base", action="store_true", help="leave the base model out")
    ap.add_argument(
        "--tasks", type=int, default=None, help="N dev tasks spread over the 51 (default: all) and N train instances"
    )
    ap.add_argument("--quick", action="store_true", help="a smoke run: 2 tasks of each set, the base model")
    ap.add_argument("--model", default=None, help="model name or directory (default: AGENTLOOP_MODEL)")
    ap.add_argument("--json", action="store_true", help="print only the JSON object")
    ap.add_argument(
        "--prompt-example",
        choices=("fixed", "nearest"),
        default="fixed",
        help="the worked example each episode shows (AGENTLOOP_PROMPT_EXAMPLE; agent/examples.py)",
    )
    ap.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md's agreement_errors section")
    args = ap.parse_args()
    os.environ["AGENTLOOP_PROMPT_EXAMPLE"] = args.prompt_example  # before the settings are first read
    models = models_to_measure(ap, args.adapter, base=not args.no_base)
    if not models:
        ap.error("nothing to measure: --no-base and no --adapter")
    n = 2 if args.quick else args.tasks

    from transformers import AutoTokenizer

    settings = get_settings()
    model_dir = resolve_model_dir(args.model or settings.model, settings.models_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    sets = {"dev": dev_tasks(n), "train instances": train_tasks(n or 51)}
    rollouts = {name: experts.expert_rollouts(tokenizer, tasks, LIMITS) for name, tasks in sets.items()}
    result: dict[str, Any] = {
        "model": model_dir.name,
        "dev_tasks": len(sets["dev"]),
        "train_tasks": len(sets["train instances"]),
        "quick": args.quick,
        "prompt_example": args.prompt_example,
        "models": {},
    }
    for label, adapter in models:
        t0 = time.perf_counter()
        model = load(model_dir, adapter)
        result["models"][label] = {name: measure(model, tokenizer, rs) for name, rs in rollouts.items()}
        if not args.json:
            for name, m in result["models"][label].items():
                print(
                    f"{label:>16} {name:>16}: agreement {m['agreement']:5.1f} % of {m['steps']} steps, "
                    f"episodes all agreed {m['episodes_all_agreed']:5.1f} %  ({time.perf_counter() - t0:.0f} s)"
                )
                print(f"{'':>34}first divergence: {m['first_divergence']}")
        del model
    if args.write_docs:
        shown = [a for a in sys.argv[1:] if a not in ("--write-docs", "--json")]
        section = SECTION + ("_nearest" if args.prompt_example == "nearest" else "")  # the fixed runs' table stays
        write_section(section, docs_section(result, "python bench/agreement_errors.py " + shlex.join(shown)))
    emit(result)


if __name__ == "__main__":
    main()
