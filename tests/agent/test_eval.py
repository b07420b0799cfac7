"""Evaluation runs: the oracle solves every split, a random policy solves nothing; the command works."""

import json
import subprocess
import sys

import pytest

from agentloop.agent.episode import Limits
from agentloop.agent.eval_runs import oracle_preparer, parse_policy, world_tasks
from agentloop.agent.evaluate import run_eval, summarize
from agentloop.apps.builtin import BUILTIN
from agentloop.apps.digest import task_digests, world_digest
from agentloop.apps.tasks import SPLITS
from agentloop.policy.random_policy import RandomPolicy
from agentloop.policy.scripted import ScriptedPolicy


@pytest.mark.parametrize("split", SPLITS)
def test_oracle_tgc_is_100_on_every_split(split, tokenizer):
    policy = ScriptedPolicy(tokenizer, name="oracle")
    results = run_eval(
        policy,
        world_tasks(BUILTIN, split),
        k=1,
        limits=Limits(max_turns=60),
        batch_size=64,
        prepare=oracle_preparer(policy),
    )
    summary = summarize(results)
    assert summary["tgc"] == 100.0 and summary["sgc"] == 100.0, [
        (r.task.task_ref, r.verdict.to_dict()) for r in results if not r.success
    ]
    assert summary["splits"] == {split: summary["splits"][split]} and summary["tasks"] == len(BUILTIN.tasks(split))
    assert summary["solved"] == sorted({r.task.task_ref for r in results})


def test_random_policy_solves_about_nothing(tokenizer):
    policy = RandomPolicy(tokenizer, BUILTIN.apps, seed=0)
    results = run_eval(policy, world_tasks(BUILTIN, "dev"), k=2, limits=Limits(max_turns=10), batch_size=64)
    summary = summarize(results)
    assert summary["tgc"] <= 5.0 and summary["episodes"] == 2 * len(BUILTIN.tasks("dev"))
    assert 0.0 < summary["mean_reward"] < 1.0  # partial credit from tests a do-nothing agent passes


def test_sgc_needs_every_task_of_a_scenario(tokenizer):
    policy = ScriptedPolicy(tokenizer, name="oracle")
    tasks = world_tasks(BUILTIN, "train")[:6]  # two whole scenarios
    prepare = oracle_preparer(policy)

    def sabotage(ep, task):  # the second variant of the first scenario gives up at once
        if task.task_ref == tasks[1].task_ref:
            policy.plan(ep.key, [])
        else:
            prepare(ep, task)

    summary = summarize(run_eval(policy, tasks, k=1, limits=Limits(), batch_size=8, prepare=sabotage))
    assert summary["tgc"] == pytest.approx(100 * 5 / 6, abs=0.01)
    assert summary["sgc"] == 50.0
    assert summary["solved"] == sorted(t.task_ref for t in tasks if t.task_ref != tasks[1].task_ref)


def test_policy_specs():
    assert parse_policy("model@smollm2-135m-instruct@v3") == ("model", "smollm2-135m-instruct@v3")
    assert parse_policy("oracle") == ("oracle", None)
    for bad in ("gpt", "oracle@v1"):
        with pytest.raises(ValueError, match="--policy must be"):
            parse_policy(bad)


def test_eval_and_world_commands(isolated_home, tiny_model_dir, configure_env):
    configure_env(MODEL=tiny_model_dir)  # the oracle only uses its tokenizer
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentloop.cli",
            "eval",
            "--split",
            "dev",
            "--policy",
            "oracle",
            "--limit",
            "5",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["tgc"] == 100.0 and summary["episodes"] == 5 and summary["eval_run"]
    assert "TGC" in out.stderr  # the progress bar and the table
    # the oracle never fails a call, never sends two, never confabulates
    assert summary["behaviour"]["failed_calls_per_episode"] == 0.0
    assert summary["behaviour"]["multi_action_turn_rate"] == 0.0 and "behaviour: api_docs_calls" in out.stderr

    stats = subprocess.run(
        [sys.executable, "-m", "agentloop.cli", "world", "stats", "--json"], capture_output=True, text=True, timeout=120
    )
    data = json.loads(stats.stdout)
    assert data["apps"] >= 10 and data["apis"] >= 100 and data["tasks"] >= 300 and data["scenarios"] >= 100
    assert set(data["splits"]) == set(SPLITS)

    bad = subprocess.run(
        [sys.executable, "-m", "agentloop.cli", "eval", "--split", "nope", "--policy", "oracle"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode != 0 and "no tasks in split 'nope'" in bad.stderr

    # named tasks of any split, a procedural instance among them, instead of a split
    refs = isolated_home / "refs.txt"
    refs.write_text("music_like_song-2\n\nmail_send_simple-1\nwallet_balance@12345\n")
    named = subprocess.run(
        [sys.executable, "-m", "agentloop.cli", "eval", "--task-refs", str(refs), "--policy", "oracle", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert named.returncode == 0, named.stderr
    summary = json.loads(named.stdout.strip().splitlines()[-1])
    assert summary["tgc"] == 100.0 and summary["episodes"] == 3
    # fresh instances of the train scenarios instead of a split: new seeds, solved by the oracle
    fresh = subprocess.run(
        [sys.executable, "-m", "agentloop.cli", "eval", "--fresh", "4", "--seed", "3", "--policy", "oracle", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert fresh.returncode == 0, fresh.stderr
    summary = json.loads(fresh.stdout.strip().splitlines()[-1])
    assert summary["tgc"] == 100.0 and summary["episodes"] == 4 and summary["split"] == "fresh@3"
    assert summary["splits"].keys() == {"train"} and summary["scenarios"] == 4
    both = subprocess.run(
        [sys.executable, "-m", "agentloop.cli", "eval", "--fresh", "2", "--task-refs", str(refs), "--policy", "oracle"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert both.returncode != 0 and "not with --task-refs or --app" in both.stderr
    refs.write_text("music_like_song-2\nno_such_task-1\n")
    unknown = subprocess.run(
        [sys.executable, "-m", "agentloop.cli", "eval", "--task-refs", str(refs), "--policy", "oracle"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert unknown.returncode != 0 and "no task(s) no_such_task-1" in unknown.stderr

    digest = subprocess.run(
        [sys.executable, "-m", "agentloop.cli", "world", "digest", "--split", "dev", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert digest.returncode == 0, digest.stderr
    got = json.loads(digest.stdout)
    assert got["tasks"] == len(BUILTIN.task_ids("dev")) == len(got["per_task"])
    assert got["digest"] == world_digest(task_digests(BUILTIN, "dev"))  # another process, the same tasks
