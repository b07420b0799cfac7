"""The continuous batcher behind `agentloop inference`: rows join a running batch, rows on different adapters
share forwards, finished sequences' keys/values are reused, and every sampled token's log-prob is the one a
plain teacher-forced forward gives."""

import time

import pytest
import torch

from agentloop.policy.base import GenerationRequest
from agentloop.policy.continuous import ContinuousBatcher, UnknownAdapter
from tests.factories import save_random_lora, tiny_policy


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return {name: str(save_random_lora(tiny_model_dir, root / name, seed=i + 1)) for i, name in enumerate("ab")}


@pytest.fixture
def engine(tiny_model_dir):
    engine = ContinuousBatcher(tiny_policy(tiny_model_dir), max_rows=8, max_loras=2, seed=3)
    yield engine
    engine.stop()


def naive_logprobs(engine, context, tokens, adapter=None, temperature=1.0):
    """Teacher-forced log-probs of `tokens` after `context` on `adapter`, the slow obvious way."""
    model = engine.policy.model
    ids = torch.tensor([list(context) + list(tokens)])
    with torch.no_grad():
        if adapter is None and hasattr(model, "disable_adapter"):
            with model.disable_adapter():
                logits = model(input_ids=ids).logits[0].float()
        else:
            if adapter is not None:
                model.set_adapter(adapter)
            logits = model(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits / temperature, -1)
    return [logp[len(context) - 1 + i, t].item() for i, t in enumerate(tokens)]


def encode(engine, text):
    return engine.tokenizer.encode(text, add_special_tokens=False)


def wait_steps(engine, n, timeout=30.0):
    deadline = time.monotonic() + timeout
    while engine.steps < n:
        assert time.monotonic() < deadline, "the batcher did not step"
        time.sleep(0.001)


def test_a_request_joins_a_running_batch_and_every_log_prob_is_exact(engine):
    long_ctx = encode(engine, "A long request that decodes for a while before the other one arrives, padded out.")
    first = engine.submit(GenerationRequest(long_ctx, max_new_tokens=40, temperature=1.0))
    wait_steps(engine, 3)
    short_ctx = encode(engine, "late")
    second = engine.submit(GenerationRequest(short_ctx, max_new_tokens=12, temperature=0.7))
    a, b = first.result(timeout=60), second.result(timeout=60)
    assert engine.joined_running >= 1 and engine.most_rows == 2
    assert a.logprobs == pytest.approx(naive_logprobs(engine, long_ctx, a.token_ids), abs=1e-4)
    assert b.logprobs == pytest.approx(naive_logprobs(engine, short_ctx, b.token_ids, temperature=0.7), abs=1e-4)
    assert len(b.token_ids) <= 12 and (b.finish_reason == "stop") == (b.token_ids[-1] in engine.policy.stop_ids)


def test_greedy_rows_give_what_they_give_alone(engine):
    contexts = [encode(engine, t) for t in ("one", "two words", "and a third, longer context than both")]
    alone = [engine.generate([GenerationRequest(c, 10, temperature=0.0)])[0] for c in contexts]
    together = engine.generate([GenerationRequest(c, 10, temperature=0.0) for c in contexts])
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    assert together[1].text == engine.tokenizer.decode(together[1].token_ids, skip_special_tokens=True)


def test_rows_on_two_adapters_and_the_base_model_decode_together(engine, adapters):
    for name, path in adapters.items():
        engine.register(name, path)
    ctx = encode(engine, "The same context on three models.")
    gens = engine.generate([GenerationRequest(ctx, 10, 1.0, adapter) for adapter in ("a", None, "b")])
    assert engine.most_rows == 3 and engine.most_adapters == 3
    for adapter, gen in zip(("a", None, "b"), gens, strict=True):
        assert gen.logprobs == pytest.approx(naive_logprobs(engine, ctx, gen.token_ids, adapter), abs=1e-4)
    # the adapters change the model: the same tokens have other log-probs on each
    tokens = gens[0].token_ids
    assert naive_logprobs(engine, ctx, tokens, "a") != pytest.approx(naive_logprobs(engine, ctx, tokens, "b"), abs=1e-3)


def test_the_next_turn_reuses_the_finished_turns_keys_and_values(engine):
    ctx = encode(engine, "An episode's first turn, whose context the second turn extends, word for word.")
    first = engine.generate([GenerationRequest(ctx, 8, 1.0)])[0]
    turn2 = ctx + first.token_ids + encode(engine, " and an observation")
    hits = engine.prefix_hits
    second = engine.generate([GenerationRequest(turn2, 8, 1.0)])[0]
    assert engine.prefix_hits == hits + 1
    assert second.logprobs == pytest.approx(naive_logprobs(engine, turn2, second.token_ids), abs=1e-4)


def test_adapters_past_the_resident_limit_are_paged_in_and_out(tiny_model_dir, adapters, tmp_path):
    engine = ContinuousBatcher(tiny_policy(tiny_model_dir), max_rows=4, max_loras=1, seed=0)
    try:
        for name, path in adapters.items():
            engine.register(name, path)
        assert sorted(engine.registered()) == ["a", "b"] and engine.resident() == ["b"]
        ctx = encode(engine, "paged adapters")
        for adapter in ("a", "b", "a"):
            gen = engine.generate([GenerationRequest(ctx, 6, 1.0, adapter)])[0]
            assert engine.resident() == [adapter]
            assert gen.logprobs == pytest.approx(naive_logprobs(engine, ctx, gen.token_ids, adapter), abs=1e-4)
        # both wanted at once with one slot: one waits for the other to finish, neither fails
        gens = engine.generate([GenerationRequest(ctx, 6, 1.0, "a"), GenerationRequest(ctx, 6, 1.0, "b")])
        assert [len(g.token_ids) > 0 for g in gens] == [True, True]
    finally:
        engine.stop()


def test_unknown_and_unloaded_adapters_are_refused(engine, adapters):
    with pytest.raises(UnknownAdapter, match="'nope' is not loaded"):
        engine.submit(GenerationRequest([1, 2, 3], 4, 1.0, "nope"))
    engine.register("a", adapters["a"])
    with pytest.raises(ValueError, match="already loaded"):
        engine.register("a", adapters["a"])
    with pytest.raises(FileNotFoundError):
        engine.register("c", "/nonexistent")
    engine.unregister("a")
    assert engine.registered() == {}
    with pytest.raises(UnknownAdapter):
        engine.submit(GenerationRequest([1, 2, 3], 4, 1.0, "a"))
    with pytest.raises(ValueError, match="empty context"):
        engine.submit(GenerationRequest([], 4))


def test_rows_that_end_early_leave_the_batch_and_the_rest_stay_exact(engine):
    contexts = [encode(engine, t) for t in ("first of three", "the second, a little longer", "third")]
    futures = [engine.submit(GenerationRequest(c, n, 1.0)) for c, n in zip(contexts, (3, 4, 30), strict=True)]
    futures[1].result(timeout=60)  # two of three done: the batch is rebuilt with the third alone
    late_ctx = encode(engine, "a late one joins the rebuilt batch")
    futures.append(engine.submit(GenerationRequest(late_ctx, 8, 1.0)))
    gens = [f.result(timeout=60) for f in futures]
    for ctx, gen in zip([*contexts, late_ctx], gens, strict=True):
        assert gen.logprobs == pytest.approx(naive_logprobs(engine, ctx, gen.token_ids), abs=1e-4)
    assert [len(g.token_ids) <= n for g, n in zip(gens, (3, 4, 30, 8), strict=True)] == [True] * 4
