"""The update step under accelerate with 2 CPU processes (gloo): both end with identical adapter
weights, equal to one process training on the whole batch."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).with_name("ddp_update.py")
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(args, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.timeout(360)
def test_two_gloo_processes_end_with_identical_adapters(tiny_model_dir, tmp_path):
    two, one = tmp_path / "two", tmp_path / "one"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    _run(
        [
            *torchrun,
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(_free_port()),
            str(SCRIPT),
            str(tiny_model_dir),
            str(two),
        ],
        tmp_path,
    )
    _run([sys.executable, str(SCRIPT), str(tiny_model_dir), str(one)], tmp_path)
    rank0, rank1 = torch.load(two / "rank0.pt"), torch.load(two / "rank1.pt")
    single = torch.load(one / "rank0.pt")
    assert rank0.keys() == rank1.keys() == single.keys() and rank0
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name  # the same weights on both processes
        torch.testing.assert_close(rank0[name], single[name], rtol=1e-4, atol=1e-5)  # = one process, whole batch
    lora_b = [k for k in rank0 if "lora_B" in k]
    assert lora_b and any(rank0[k].abs().sum() > 0 for k in lora_b)  # it trained (B starts at zero)


@pytest.mark.timeout(400)
def test_agentloop_learn_under_torchrun(sqlite_db, lights_plugin, lights_model_dir, configure_env, tmp_path):
    """The whole trainer with 2 processes: the main one samples, stores, evaluates and reports; both update."""
    from agentloop.store.db import session_scope
    from agentloop.store.models import Adapter, Episode, TrainingRun

    configure_env(MODEL=str(lights_model_dir), MAX_BATCH_SIZE=16)
    args = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
        "-m",
        "agentloop.cli",
        "learn",
        "--iterations",
        "2",
        "--tasks-per-iteration",
        "4",
        "--rollouts-per-task",
        "3",
        "--max-turns",
        "1",
        "--max-new-tokens",
        "40",
        "--dev-limit",
        "2",
        "--set",
        "world=lights",
        "--set",
        "dev_max_turns=1",
        "--set",
        "micro_batch_size=2",
        "--set",
        "promotion_tolerance=100",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=380, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    with session_scope() as s:
        (run,) = s.query(TrainingRun).all()
        assert run.status == "finished" and run.iteration == 2 and len(run.metrics) == 2
        rollouts = s.query(Episode).filter_by(training_run_id=run.id, kind="rollout").count()
        assert rollouts == 2 * 4 * 3  # sampled and stored once, by the main process
        assert s.query(Adapter).count() == sum(1 for m in run.metrics if m.get("adapter"))
