"""LOOP learns: a tiny model in a toy world where the rewarded behaviour is known."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentloop.apps.tasks import OracleClient
from agentloop.learner.config import LoopConfig
from agentloop.learner.model import lora_model
from agentloop.learner.rl import LoopTrainer
from agentloop.settings import get_settings
from agentloop.store.db import session_scope
from agentloop.store.models import Adapter, TrainingRun
from tests.learner.lights_world import turn_off_oracle


@pytest.mark.timeout(1200)
def test_loop_raises_the_success_rate(sqlite_db, lights_world, lights_model_dir, configure_env):
    configure_env(MODEL=str(lights_model_dir), MAX_BATCH_SIZE=36)
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(lights_model_dir)
    tok = AutoTokenizer.from_pretrained(lights_model_dir)
    config = LoopConfig(
        world="lights",
        splits=("train",),
        tasks_per_iteration=6,
        rollouts_per_task=6,
        # 10 iterations: at lr 3e-3 the success rate climbs about 0.04 per iteration (measured on seeds 1 and 2:
        # 0.14 -> 0.52 and 0.17 -> 0.59 over the last three), so that the last three stand clear of the first
        # one's sampling noise (36 rollouts: +-0.07); after 6 the gap was within it.
        iterations=10,
        max_turns=1,
        max_new_tokens=40,
        lr=3e-3,
        clip_eps=0.3,
        epochs=3,
        minibatch_size=12,
        micro_batch_size=6,
        dev_split="dev",
        dev_max_turns=1,
        lora_r=16,
        lora_alpha=32,
        # The 2-layer model shares its few units between the answer and the tool-call syntax: pushed
        # towards "turn_on" alone it starts writing "on" into the syntax too and every call breaks.
        # The KL penalty to the warm start holds the syntax where it was.
        kl_coef=0.1,
        seed=1,
    )
    model = lora_model(base, config, None)
    with session_scope() as s:
        run = TrainingRun(algo="loop", status="running", trigger="test", config=config.to_dict())
        s.add(run)
        s.flush()
        run_id = run.id
    trainer = LoopTrainer(get_settings(), config, run_id, model=model, tokenizer=tok)
    history = trainer.run(trainer.setup())
    rates = [m["success/rate"] for m in history]
    print("success rate per iteration:", rates)
    assert rates[0] <= 0.4, rates  # the warm start mostly takes the wrong action (about 4 in 5)
    late = sum(rates[-3:]) / 3
    assert late >= rates[0] + 0.2 and late >= 1.6 * rates[0], rates  # then it learns the rewarded one
    assert all(m["loss/approx_kl"] < config.kl_stop for m in history)
    with session_scope() as s:
        status = {a.name: a.status for a in s.query(Adapter)}
        assert sorted(status) == sorted(m["adapter"] for m in history)  # one version per iteration
        promoted = [m["adapter"] for m in history if m["adapter/promoted"]]
        assert promoted  # it got better than the warm start on dev at least once
        for m in history:  # each version's row says what its gate decided
            expected = (
                "rejected" if not m["adapter/promoted"] else "active" if m["adapter"] == promoted[-1] else "retired"
            )
            assert status[m["adapter"]] == expected, (m["adapter"], status)
        run = s.get(TrainingRun, run_id)
        assert run.iteration == 10 and len(run.metrics) == 10


def test_the_wrong_action_is_really_wrong(lights_world):
    task = lights_world.task("lights-0")
    world = lights_world.task_world("lights-0")
    before = world.copy_state()
    turn_off_oracle(OracleClient(world))
    assert not task.evaluator.evaluate(before, world.state, None).success
