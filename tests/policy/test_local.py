import pytest
import torch

from agentloop.policy.base import GenerationRequest
from tests.factories import save_random_lora, tiny_policy


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return tiny_policy(tiny_model_dir, seed=1)


def naive_logprobs(model, context, tokens, temperature=1.0):
    """Teacher-forced log-probs of `tokens` after `context`, the slow obvious way."""
    ids = torch.tensor([list(context) + list(tokens)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float() / temperature  # (T, V)
    logp = torch.log_softmax(logits, -1)
    start = len(context)
    return [logp[start - 1 + i, t].item() for i, t in enumerate(tokens)]


def test_sampled_logprobs_match_a_teacher_forced_forward(policy):
    ctx = policy.tokenizer.encode("Hello there, agent.", add_special_tokens=False)
    for temperature in (1.0, 0.7):
        gen = policy.generate([GenerationRequest(ctx, max_new_tokens=12, temperature=temperature)])[0]
        assert len(gen.token_ids) == len(gen.logprobs) <= 12
        expected = naive_logprobs(policy.model, ctx, gen.token_ids, temperature)
        assert gen.logprobs == pytest.approx(expected, abs=1e-4)


def test_batch_with_left_padding_matches_single_requests(policy):
    tok = policy.tokenizer
    contexts = [tok.encode(t, add_special_tokens=False) for t in ("short", "a much longer context than the other one")]
    gens = policy.generate([GenerationRequest(c, max_new_tokens=8, temperature=1.0) for c in contexts])
    for ctx, gen in zip(contexts, gens, strict=True):
        assert gen.logprobs == pytest.approx(naive_logprobs(policy.model, ctx, gen.token_ids), abs=1e-4)


def test_greedy_is_deterministic_and_limits_are_per_request(policy):
    ctx = policy.tokenizer.encode("Count:", add_special_tokens=False)
    a, b = policy.generate([GenerationRequest(ctx, 10, temperature=0.0), GenerationRequest(ctx, 4, temperature=0.0)])
    assert a.token_ids[:4] == b.token_ids
    assert len(b.token_ids) == 4 and b.finish_reason == "length"
    assert a.text == policy.tokenizer.decode(a.token_ids, skip_special_tokens=True)


def test_stops_at_end_of_turn_token(policy):
    eos = policy.tokenizer.eos_token_id
    # make the end-of-turn token overwhelmingly likely by biasing the output layer
    head = policy.model.get_output_embeddings()
    saved = head.weight.data[eos].clone()
    head.weight.data[eos] = head.weight.data.abs().max() * 50 * torch.sign(policy.model.model.norm.weight.data)
    try:
        gen = policy.generate([GenerationRequest([1, 2, 3], max_new_tokens=20, temperature=1.0)])[0]
    finally:
        head.weight.data[eos] = saved
    assert gen.finish_reason == "stop" and gen.token_ids[-1] == eos
    assert gen.text == policy.tokenizer.decode(gen.token_ids[:-1], skip_special_tokens=True)


def test_adapters_load_by_name_change_outputs_and_unload(tiny_model_dir, tmp_path):
    policy = tiny_policy(tiny_model_dir, seed=3)
    ctx = policy.tokenizer.encode("The wallet balance is", add_special_tokens=False)
    base = policy.generate([GenerationRequest(ctx, 6, temperature=0.0)])[0]
    path = save_random_lora(tiny_model_dir, tmp_path / "lora", scale=2.0)
    policy.load_adapter("tiny@v1", str(path))
    with_lora, base_again = policy.generate(
        [
            GenerationRequest(ctx, 6, temperature=0.0, adapter="tiny@v1"),
            GenerationRequest(ctx, 6, temperature=0.0, adapter=None),
        ]
    )
    assert base_again.token_ids == base.token_ids
    assert with_lora.logprobs != pytest.approx(base.logprobs, abs=1e-3)
    assert policy.loaded_adapters() == {"tiny@v1"}
    with pytest.raises(KeyError, match="not loaded"):
        policy.generate([GenerationRequest(ctx, 2, adapter="tiny@v9")])
    policy.unload_adapter("tiny@v1")
    assert policy.loaded_adapters() == set()
    assert policy.generate([GenerationRequest(ctx, 6, temperature=0.0)])[0].token_ids == base.token_ids


def test_missing_adapter_directory_is_a_clear_error(policy, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"adapter_config\.json"):
        policy.load_adapter("x@v1", str(tmp_path))


def test_prefix_cache_reuses_an_episodes_context_without_changing_results(tiny_model_dir):
    """Three turns of two episodes of different lengths, with and without cached prefixes: the same
    greedy tokens, and log-probs equal to a teacher-forced forward pass."""
    cached = tiny_policy(tiny_model_dir, seed=5)
    plain = tiny_policy(tiny_model_dir, seed=5, max_cached_episodes=0)
    tok = cached.tokenizer
    contexts = {
        "a": tok.encode("first episode starts here", add_special_tokens=False),
        "b": tok.encode("the second one has a noticeably longer opening context", add_special_tokens=False),
    }
    fed_tokens = []
    for turn in range(3):
        reqs = [GenerationRequest(list(ctx), 6, temperature=0.0, key=key) for key, ctx in contexts.items()]
        with_cache = cached.generate(reqs)
        without = plain.generate(reqs)
        for (key, ctx), a, b in zip(contexts.items(), with_cache, without, strict=True):
            assert a.token_ids == b.token_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
            assert a.logprobs == pytest.approx(naive_logprobs(cached.model, ctx, a.token_ids), abs=1e-4)
            observation = tok.encode(f" observation {turn} for {key}", add_special_tokens=False)
            contexts[key] = ctx + a.token_ids + observation
        fed_tokens.append(sum(len(p.tokens) for p in cached._prefixes.values()))
    assert set(cached._prefixes) == {"a", "b"} and fed_tokens[0] < fed_tokens[1] < fed_tokens[2]
    cached.end_episode("a")
    assert set(cached._prefixes) == {"b"}


def test_prefix_is_not_reused_when_the_context_diverges_or_the_adapter_differs(tiny_model_dir, tmp_path):
    policy = tiny_policy(tiny_model_dir, seed=2)
    tok = policy.tokenizer
    ctx = tok.encode("a shared beginning", add_special_tokens=False)
    first = policy.generate([GenerationRequest(ctx, 4, temperature=0.0, key="k")])[0]
    other = ctx[:-1] + tok.encode(" different", add_special_tokens=False)
    assert policy._reusable(GenerationRequest(other, 4, key="k"), None)[0] == len(ctx) - 1
    longer = ctx + first.token_ids + [5, 6]
    assert policy._reusable(GenerationRequest(longer, 4, key="k"), None)[0] > len(ctx)
    assert policy._reusable(GenerationRequest(longer, 4, key="k"), "tiny@v1")[0] == 0
    # a diverged context still gives teacher-forced log-probs
    gen = policy.generate([GenerationRequest(other, 5, temperature=1.0, key="k")])[0]
    assert gen.logprobs == pytest.approx(naive_logprobs(policy.model, other, gen.token_ids), abs=1e-4)


def test_a_new_episode_reuses_the_opening_another_one_computed(tiny_model_dir):
    """Episodes share their opening (system prompt, example): a new episode's first turn feeds only what
    differs, with the same greedy tokens and teacher-forced log-probs."""
    cached = tiny_policy(tiny_model_dir, seed=3)
    plain = tiny_policy(tiny_model_dir, seed=3, max_cached_episodes=0)
    tok = cached.tokenizer
    opening = tok.encode("You are an agent. You call APIs of apps to do what the user asks, step by step.")
    first = opening + tok.encode(" Task: turn the lights on.", add_special_tokens=False)
    second = opening + tok.encode(" Task: what is my wallet balance?", add_special_tokens=False)
    cached.generate([GenerationRequest(first, 5, temperature=0.0, key="one")])
    reused, prefix = cached._reusable(GenerationRequest(second, 5, key="two"), None)
    assert reused >= len(opening) and prefix is not None and prefix.tokens[: len(opening)] == opening
    a = cached.generate([GenerationRequest(second, 6, temperature=0.0, key="two")])[0]
    b = plain.generate([GenerationRequest(second, 6, temperature=0.0, key="two")])[0]
    assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert a.logprobs == pytest.approx(naive_logprobs(cached.model, second, a.token_ids), abs=1e-4)
    assert cached._reusable(GenerationRequest(tok.encode("Something else entirely."), 5), None) == (0, None)
    assert cached._reusable(GenerationRequest(second, 5, key="three"), "tiny@v1") == (0, None)  # other adapter
    cached.clear_cache()
    assert cached._reusable(GenerationRequest(second, 5, key="three"), None) == (0, None)


def test_a_batch_of_new_episodes_computes_its_common_opening_once(tiny_model_dir):
    cached = tiny_policy(tiny_model_dir, seed=4)
    plain = tiny_policy(tiny_model_dir, seed=4, max_cached_episodes=0)
    tok = cached.tokenizer
    opening = tok.encode("You are an agent. You call APIs of apps to do what the user asks, step by step.")
    reqs = [
        GenerationRequest(opening + tok.encode(f" Task {i}: {task}", add_special_tokens=False), 6, 0.0, key=str(i))
        for i, task in enumerate(["lights on", "my wallet balance, please", "lights on"])
    ]
    primed = []
    prime = cached._prime_shared
    cached._prime_shared = lambda new, adapter, **kw: primed.append(len(new)) or prime(new, adapter, **kw)  # type: ignore[method-assign]
    a, b = cached.generate(reqs), plain.generate(reqs)
    assert primed == [3] and cached._reusable(reqs[1], None)[0] >= len(opening)  # computed once, shared by three
    for x, y, req in zip(a, b, reqs, strict=True):
        assert x.token_ids == y.token_ids and x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
        assert x.logprobs == pytest.approx(naive_logprobs(cached.model, req.context, x.token_ids), abs=1e-4)


def test_rows_with_the_same_context_are_prefilled_once_and_sampled_apart(tiny_model_dir):
    """M samples at one expert prefix (or the first turns of K rollouts of a task): the model runs over the
    context once, and each row still draws its own tokens, with teacher-forced log-probs."""
    policy = tiny_policy(tiny_model_dir, seed=5, max_cached_episodes=0)
    tok = policy.tokenizer
    prefix = tok.encode("The expert's prefix: an instruction, calls and observations.", add_special_tokens=False)
    other = tok.encode("Another prefix.", add_special_tokens=False)
    reqs = [GenerationRequest(prefix, 8, temperature=1.0)] * 4 + [GenerationRequest(other, 8, temperature=1.0)]
    shapes, forward = [], policy.model.forward
    policy.model.forward = lambda *a, **k: shapes.append(tuple(k["input_ids"].shape)) or forward(*a, **k)
    gens = policy.generate(reqs)
    assert shapes[0] == (2, len(prefix))  # the prefill: one row per distinct context
    assert {rows for rows, _ in shapes[1:]} == {5}  # decoding: every row
    assert len({tuple(g.token_ids) for g in gens[:4]}) > 1  # the four samples at one prefix differ
    for gen, req in zip(gens, reqs, strict=True):
        assert gen.logprobs == pytest.approx(naive_logprobs(policy.model, req.context, gen.token_ids), abs=1e-4)


def test_a_long_batch_is_prefilled_a_few_rows_at_a_time_with_the_same_results(tiny_model_dir, monkeypatch):
    """Rows sharing an opening (a cached prefix), prefilled one row per forward: the batch
    samples the same greedy tokens with the same log-probs as prefilled whole."""
    from agentloop.policy import local

    tok = tiny_policy(tiny_model_dir, seed=1).tokenizer
    opening = tok.encode("You are an agent. Here is a long opening all rows share. " * 3, add_special_tokens=False)
    tails = ["Task one.", "The second task, longer.", "Three", "And a fourth task here."]
    requests = [GenerationRequest(opening + tok.encode(t, add_special_tokens=False), 8, temperature=0.0) for t in tails]

    def run(prefill_tokens: int) -> list[tuple[list[int], list[float]]]:
        monkeypatch.setattr(local, "PREFILL_TOKENS", prefill_tokens)
        policy = tiny_policy(tiny_model_dir, seed=1)
        calls, forward = [], policy.model.forward
        policy.model.forward = lambda *a, **k: calls.append(k["input_ids"].shape[0]) or forward(*a, **k)
        gens = policy.generate(requests)
        return [(g.token_ids, g.logprobs) for g in gens], calls

    whole, whole_calls = run(10**6)
    chunked, chunked_calls = run(1)  # one row per prefill forward
    assert [t for t, _ in chunked] == [t for t, _ in whole]
    for (_, a), (_, b) in zip(chunked, whole, strict=True):
        assert a == pytest.approx(b, abs=1e-4)
    # the opening once (1 row), then the prefill: the 4 rows together, or one by one; then decoding all 4
    assert whole_calls[:2] == [1, 4] and chunked_calls[:6] == [1, 1, 1, 1, 1, 4]


def test_batches_stay_within_the_token_budget_with_the_same_results(tiny_model_dir):
    """Rows are decoded together only while rows x (longest context + new tokens) fits max_batch_tokens;
    a row wider than the budget decodes alone; what each row samples greedily does not change."""
    tok = tiny_policy(tiny_model_dir).tokenizer
    texts = ["short", "a somewhat longer context " * 4, "mid length text " * 2, "tiny", "x " * 40]
    requests = [GenerationRequest(tok.encode(t, add_special_tokens=False), 6, temperature=0.0) for t in texts]
    widths = [len(r.context) + 6 for r in requests]

    def run(budget: int) -> tuple[list[list[int]], list[int]]:
        policy = tiny_policy(tiny_model_dir, seed=1, max_batch_tokens=budget, max_cached_episodes=0)
        prefills, forward = [], policy.model.forward
        policy.model.forward = lambda *a, **k: (
            (k["input_ids"].shape[1] > 1 and prefills.append(k["input_ids"].shape[0])) or forward(*a, **k)
        )
        return [g.token_ids for g in policy.generate(requests)], prefills

    whole, whole_rows = run(10**6)
    assert whole_rows == [5]
    budget = 2 * max(widths[:2])  # the first two fit together; the widest row shares no batch
    assert max(widths) > budget // 2
    split, split_rows = run(budget)
    assert split == whole
    expected, rows, width = [], 0, 0
    for w in widths:  # the packing rule, by hand
        if rows and max(width, w) * (rows + 1) <= budget:
            rows, width = rows + 1, max(width, w)
        else:
            if rows:
                expected.append(rows)
            rows, width = 1, w
    expected.append(rows)
    assert split_rows == expected and len(expected) > 1 and sum(expected) == 5


def test_a_row_wider_than_the_budget_decodes_alone(tiny_model_dir):
    policy = tiny_policy(tiny_model_dir, max_batch_tokens=8)
    reqs = [GenerationRequest([5, 6, 7, 8, 9], 4), GenerationRequest([5, 6], 4), GenerationRequest([7], 4)]
    assert policy._batches(reqs, [0, 1, 2]) == [[0], [1], [2]]
    assert tiny_policy(tiny_model_dir, max_batch_tokens=12)._batches(reqs, [0, 1, 2]) == [[0], [1, 2]]


def test_a_cache_with_room_gives_what_concatenation_gives_and_grows_past_its_room(tiny_model_dir):
    """Decoding with keys/values written into a preallocated buffer (room for 3 tokens, then 8 steps: it grows
    twice) gives the logits and the cache of transformers' own cache, which concatenates."""
    from transformers import AutoModelForCausalLM, DynamicCache

    from agentloop.policy.kv import GrowingLayer, with_room
    from agentloop.policy.models import output_cache

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    ids = torch.randint(0, 1000, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # a left-padded row
    with torch.inference_mode():
        first = model(input_ids=ids, attention_mask=mask, use_cache=True)
        kv = [(lay.keys, lay.values) for lay in output_cache(first).layers]
        plain, grown = DynamicCache(ddp_cache_data=kv), with_room(DynamicCache(ddp_cache_data=kv), 3)
        assert all(isinstance(lay, GrowingLayer) for lay in grown.layers)
        tok = first.logits[:, -1].argmax(-1, keepdim=True)
        pos = mask.sum(dim=1, keepdim=True)
        for _ in range(8):
            mask = torch.cat([mask, torch.ones((2, 1), dtype=mask.dtype)], dim=-1)
            a = model(input_ids=tok, attention_mask=mask, position_ids=pos, cache=plain, use_cache=True)
            b = model(input_ids=tok, attention_mask=mask, position_ids=pos, cache=grown, use_cache=True)
            torch.testing.assert_close(a.logits, b.logits)
            plain, grown = output_cache(a), output_cache(b)
            tok, pos = a.logits[:, -1].argmax(-1, keepdim=True), pos + 1
        assert grown.get_seq_length() == plain.get_seq_length() == 20
        for p_lay, g_lay in zip(plain.layers, grown.layers, strict=True):
            torch.testing.assert_close(g_lay.keys, p_lay.keys)
            torch.testing.assert_close(g_lay.values, p_lay.values)


@pytest.mark.parametrize("stacked", [True, False], ids=["stacked", "peft_adapter_names"])
def test_a_batch_mixing_adapters_samples_each_row_as_its_adapter_alone_would(tiny_model_dir, tmp_path, stacked):
    """Rows on three adapters and the base model decode in one batch (PEFT's mixed-adapter forward): the same
    greedy tokens, and log-probs matching a teacher-forced forward on each row's adapter, as one batch per
    adapter gives; over two turns (cached prefixes per adapter), and with one context on several adapters."""
    names = [f"tiny@v{i}" for i in (1, 2, 3)]
    paths = [save_random_lora(tiny_model_dir, tmp_path / n, seed=i, scale=2.0) for i, n in enumerate(names)]
    mixed = tiny_policy(tiny_model_dir, seed=5, mixed_adapter_batches=True)
    grouped = tiny_policy(tiny_model_dir, seed=5, mixed_adapter_batches=False)
    mixed.stacked_lora = stacked
    for policy in (mixed, grouped):
        for name, path in zip(names, paths, strict=True):
            policy.load_adapter(name, str(path))
    from agentloop.policy import mixed_lora

    assert mixed_lora.supported(mixed.model, names)  # the stacked form runs, not PEFT's per-adapter loop
    tok = mixed.tokenizer
    opening = tok.encode("You are an agent that calls apps. The user asks for this:", add_special_tokens=False)
    asks = ["buy milk", "call Ann", "buy milk", "pay rent", "buy milk"]
    adapters = [names[0], names[1], names[2], None, names[0]]  # "buy milk" on three adapters, twice on v1
    contexts = [opening + tok.encode(" " + a, add_special_tokens=False) for a in asks]
    turns = {}
    for label, policy in (("mixed", mixed), ("grouped", grouped)):
        out = []
        ctx = [list(c) for c in contexts]
        for _ in range(2):
            reqs = [
                GenerationRequest(c, 6, temperature=0.0, adapter=a, key=f"e{i}")
                for i, (c, a) in enumerate(zip(ctx, adapters, strict=True))
            ]
            gens = policy.generate(reqs)
            out.append(gens)
            ctx = [
                c + g.token_ids + tok.encode(" ok", add_special_tokens=False) for c, g in zip(ctx, gens, strict=True)
            ]
        turns[label] = (out, ctx)
    for turn_m, turn_g in zip(turns["mixed"][0], turns["grouped"][0], strict=True):
        assert [g.token_ids for g in turn_m] == [g.token_ids for g in turn_g]
        for m, g in zip(turn_m, turn_g, strict=True):
            assert m.logprobs == pytest.approx(g.logprobs, abs=1e-4)
    # the rows on different adapters really differ, and each matches its adapter alone
    first = turns["mixed"][0][0]
    assert len({tuple(first[b].logprobs) for b in (0, 1, 2)}) == 3
    model = mixed.model
    for b, adapter in enumerate(adapters):
        if adapter is None:
            with model.disable_adapter():
                expected = naive_logprobs(model, contexts[b], first[b].token_ids)
        else:
            model.set_adapter(adapter)
            expected = naive_logprobs(model, contexts[b], first[b].token_ids)
        assert first[b].logprobs == pytest.approx(expected, abs=1e-4)
