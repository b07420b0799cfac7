"""The `remote` backend against `agentloop inference` in its own process (the real server speaking vLLM's
protocol), and against a broken server (truncated, malformed and slow answers) for what it must survive."""

import json
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import torch

from agentloop.policy.base import GenerationRequest
from agentloop.policy.remote import InferenceError, InferenceUnavailable, RemotePolicy
from agentloop.policy.server import start_process
from tests.factories import save_random_lora

API_KEY = "inference-test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


class Server:
    """`agentloop inference` on a free port, in its own process group."""

    def __init__(self, model_dir, log_path, api_key=API_KEY):
        options = ["--seed", "0", *(["--api-key", api_key] if api_key else [])]
        self.proc, self.url = start_process(
            model_dir, log_path, *options, env={"AGENTLOOP_TORCH_THREADS": "1"}, timeout_s=120
        )

    def stats(self):
        return httpx.get(f"{self.url}/stats", headers=AUTH).json()

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    srv = Server(tiny_model_dir, tmp_path_factory.mktemp("server") / "inference.log")
    yield srv
    srv.kill()


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return {name: str(save_random_lora(tiny_model_dir, root / name, seed=i + 1)) for i, name in enumerate("ab")}


@pytest.fixture(scope="module")
def reference(tiny_model_dir, adapters):
    """The same weights in this process, with both adapters, for teacher-forced log-probs."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model = PeftModel.from_pretrained(model, adapters["a"], adapter_name="a")
    model.load_adapter(adapters["b"], adapter_name="b")
    return model.eval()


def naive_logprobs(model, context, tokens, adapter=None, temperature=1.0):
    ids = torch.tensor([list(context) + list(tokens)])
    with torch.no_grad():
        if adapter is None:
            with model.disable_adapter():
                logits = model(input_ids=ids).logits[0].float()
        else:
            model.set_adapter(adapter)
            logits = model(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits / temperature, -1)
    return [logp[len(context) - 1 + i, t].item() for i, t in enumerate(tokens)]


@pytest.fixture
def remote(server, tokenizer):
    policy = RemotePolicy([server.url], tokenizer, name="tiny", api_key=API_KEY, timeout_s=60, backoff_s=0.05)
    yield policy
    for name in policy.loaded_adapters():
        policy.unload_adapter(name)
    policy.close()


def test_sampled_token_ids_and_log_probs_come_back_exact(remote, reference, tokenizer):
    contexts = [tokenizer.encode(t, add_special_tokens=False) for t in ("short", "a longer context, sent as ids")]
    gens = remote.generate([GenerationRequest(contexts[0], 12, 1.0), GenerationRequest(contexts[1], 9, 0.7)])
    assert remote.model == "tiny-llama-v1"  # what the server's /v1/models lists first
    for ctx, gen, temperature, limit in zip(contexts, gens, (1.0, 0.7), (12, 9), strict=True):
        assert 1 <= len(gen.token_ids) <= limit and len(gen.logprobs) == len(gen.token_ids)
        expected = naive_logprobs(reference, ctx, gen.token_ids, temperature=temperature)
        assert gen.logprobs == pytest.approx(expected, abs=1e-4)
        assert gen.text == tokenizer.decode(
            gen.token_ids[:-1] if gen.finish_reason == "stop" else gen.token_ids, skip_special_tokens=True
        )


def test_adapters_are_loaded_by_name_and_chosen_per_request_in_one_batch(remote, server, reference, adapters):
    remote.load_adapter("tenant-a@v1", adapters["a"])
    remote.load_adapter("tenant-b@v1", adapters["b"])
    listed = httpx.get(f"{server.url}/v1/models", headers=AUTH).json()["data"]
    assert [m["id"] for m in listed] == ["tiny-llama-v1", "tenant-a@v1", "tenant-b@v1"]
    assert [m["parent"] for m in listed] == [None, "tiny-llama-v1", "tiny-llama-v1"]
    ctx = [5, 6, 7, 8, 9, 10]
    rows = ["tenant-a@v1", None, "tenant-b@v1", "tenant-a@v1"]
    gens = remote.generate([GenerationRequest(ctx, 10, 1.0, adapter) for adapter in rows])
    for adapter, gen in zip(rows, gens, strict=True):
        local = {"tenant-a@v1": "a", "tenant-b@v1": "b", None: None}[adapter]
        assert gen.logprobs == pytest.approx(naive_logprobs(reference, ctx, gen.token_ids, local), abs=1e-4)
    assert server.stats()["most_adapters"] == 3  # decoded together, each row on its own adapter or the base


def test_an_adapter_the_server_lost_is_loaded_again(remote, server, adapters, tokenizer):
    remote.load_adapter("tenant-a@v2", adapters["a"])
    # another worker unloads it (or the server restarted): this process still serves it
    assert httpx.post(
        f"{server.url}/v1/unload_lora_adapter", json={"lora_name": "tenant-a@v2"}, headers=AUTH
    ).is_success
    gen = remote.generate([GenerationRequest([1, 2, 3], 4, 1.0, "tenant-a@v2")])[0]
    assert len(gen.token_ids) >= 1 and "tenant-a@v2" in server.stats()["registered"]
    # a process that never loaded it has no path to load it from: a clear error, not a sample of the base model
    stranger = RemotePolicy([server.url], tokenizer, name="tiny", api_key=API_KEY)
    remote.unload_adapter("tenant-a@v2")
    with pytest.raises(InferenceError, match="'tenant-a@v2' is not loaded"):
        stranger.generate([GenerationRequest([1, 2, 3], 4, 1.0, "tenant-a@v2")])


def test_the_server_refuses_what_it_cannot_honour(server, adapters):
    def post(path, body, headers=AUTH):
        return httpx.post(f"{server.url}{path}", json=body, headers=headers)

    base = {"prompt": [1, 2, 3], "max_tokens": 4}
    for extra, needle in [
        ({"n": 2}, "n=2 is not supported"),
        ({"top_p": 0.9}, "top_p=0.9 is not supported"),
        ({"stream": True}, "stream=True is not supported"),
        ({"stop": ["\n"]}, "stop=['\\n'] is not supported"),
        ({"logprobs": 5}, "logprobs=5 is not supported"),
        ({"prompt": [1, 10**9]}, "token id 1000000000 is out of vocabulary"),
        ({"prompt": []}, "prompt"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 10**6}, "maximum context length"),
    ]:
        resp = post("/v1/completions", {**base, **extra})
        assert resp.status_code == 400, (extra, resp.text)
        error = resp.json()["error"]
        assert needle in error["message"] and error["code"] == 400 and error["type"], (extra, error)
    resp = post("/v1/completions", {**base, "model": "nobody@v9"})
    assert resp.status_code == 404 and resp.json()["error"]["message"] == "The model `nobody@v9` does not exist."
    assert post("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/no/such/dir"}).status_code == 404
    assert post("/v1/unload_lora_adapter", {"lora_name": "never-loaded"}).status_code == 404
    post("/v1/load_lora_adapter", {"lora_name": "twice", "lora_path": adapters["b"]}).raise_for_status()
    again = post("/v1/load_lora_adapter", {"lora_name": "twice", "lora_path": adapters["b"]})
    assert again.status_code == 400 and "already" in again.json()["error"]["message"]
    post("/v1/unload_lora_adapter", {"lora_name": "twice"}).raise_for_status()
    assert post("/v1/completions", base, headers={}).status_code == 401
    bad_json = httpx.post(
        f"{server.url}/v1/completions", content=b"{not json", headers={**AUTH, "content-type": "application/json"}
    )
    assert bad_json.status_code == 400 and "error" in bad_json.json()
    # unknown fields are ignored, as vLLM does; a plain text prompt is tokenised by the server
    ok = post("/v1/completions", {"prompt": "hello", "max_tokens": 3, "user": "u1", "logprobs": 0})
    choice = ok.json()["choices"][0]
    assert ok.status_code == 200 and len(choice["logprobs"]["token_logprobs"]) == len(choice["logprobs"]["tokens"])


def test_an_episode_moves_off_a_replica_that_dies(tiny_model_dir, tmp_path, tokenizer):
    a, b = (Server(tiny_model_dir, tmp_path / f"{n}.log", None) for n in "ab")
    try:
        policy = RemotePolicy([a.url, b.url], tokenizer, name="tiny", retries=1, backoff_s=0.05, down_s=60)
        first = policy.generate([GenerationRequest([1, 2, 3], 3, 1.0, key="episode-1")])[0]
        assert first.token_ids
        pinned = policy._pins["episode-1"].url
        other = policy.generate([GenerationRequest([1, 2, 3], 3, 1.0, key="episode-2")])[0]
        assert other.token_ids and policy._pins["episode-2"].url != pinned  # new episodes spread out
        (a if pinned == a.url else b).kill()
        turn2 = policy.generate([GenerationRequest([1, 2, 3, *first.token_ids, 4], 3, 1.0, key="episode-1")])[0]
        assert turn2.token_ids and policy.moved == 1 and policy._pins["episode-1"].url != pinned
        a.kill(), b.kill()
        with pytest.raises(InferenceUnavailable, match="no inference replica answered") as caught:
            policy.generate([GenerationRequest([1, 2, 3], 3, 1.0, key="episode-1")])
        assert a.url in str(caught.value) and b.url in str(caught.value) and "unreachable" in str(caught.value)
        policy.close()
    finally:
        a.kill(), b.kill()


# --- a broken server -------------------------------------------------------------------------------------


class Broken(BaseHTTPRequestHandler):
    """Answers /v1/completions as `mode` says; counts requests."""

    mode = "ok"
    calls = 0

    def log_message(self, *args):
        pass

    def do_GET(self):
        self._send(200, json.dumps({"object": "list", "data": [{"id": "base", "parent": None}]}).encode())

    def do_POST(self):
        type(self).calls += 1
        self.rfile.read(int(self.headers.get("content-length", 0)))
        good = {"choices": [{"index": 0, "text": "x", "token_ids": [5, 6], "finish_reason": "length",
                             "logprobs": {"token_logprobs": [-0.5, -1.0], "tokens": ["a", "b"]}}]}  # fmt: skip
        choice = good["choices"][0]
        mode = self.mode
        if mode == "flaky" and type(self).calls == 1:
            mode = "500"
        if mode == "truncated":
            return self._send(200, json.dumps(good).encode()[:40])
        if mode == "lengths":
            choice["logprobs"]["token_logprobs"] = [-0.5]
        elif mode == "no-ids":
            del choice["token_ids"]
        elif mode == "vocab":
            choice["token_ids"] = [5, 10**7]
        elif mode == "positive":
            choice["logprobs"]["token_logprobs"] = [-0.5, 3.0]
        elif mode == "slow":
            time.sleep(1.5)
        elif mode == "500":
            return self._send(500, b'{"error": {"message": "engine dead", "code": 500}}')
        elif mode == "old-error":
            return self._send(400, b'{"object": "error", "message": "bad thing", "code": 400}')
        self._send(200, json.dumps(good).encode())

    def _send(self, code, body):
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def broken(tokenizer):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Broken)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    Broken.calls = 0
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    made = []

    def connect(timeout_s=10.0):
        """A backend on the broken server; a short timeout only where slowness is the point (a loaded machine
        can take longer than that to answer an ordinary request)."""
        made.append(RemotePolicy([url], tokenizer, name="tiny", timeout_s=timeout_s, retries=1, backoff_s=0.01))
        return made[-1]

    yield connect
    for policy in made:
        policy.close()
    httpd.shutdown()


@pytest.mark.parametrize(
    ("mode", "error", "needle"),
    [
        ("truncated", InferenceError, "not JSON"),
        ("lengths", InferenceError, "1 log-probs for 2 tokens"),
        ("no-ids", InferenceError, "return_token_ids"),
        ("vocab", InferenceError, "vocabulary"),
        ("positive", InferenceError, "finite number <= 0"),
        ("slow", InferenceUnavailable, "timed out"),
        ("500", InferenceUnavailable, "HTTP 500: engine dead"),
        ("old-error", InferenceError, "HTTP 400: bad thing"),
    ],
)
def test_a_broken_answer_is_a_clear_error(broken, mode, error, needle):
    Broken.mode = mode
    policy = broken(0.5 if mode == "slow" else 10.0)  # the slow answer takes 1.5 s
    with pytest.raises(error, match=needle):
        policy.generate([GenerationRequest([1, 2, 3], 4, 1.0, key="e")])
    assert Broken.calls == (2 if error is InferenceUnavailable else 1)  # only outages are retried


def test_a_failed_try_is_retried(broken):
    Broken.mode = "flaky"
    gen = broken().generate([GenerationRequest([1, 2, 3], 4, 1.0)])[0]
    assert gen.token_ids == [5, 6] and gen.logprobs == [-0.5, -1.0] and Broken.calls == 2


def test_adapters_swap_while_episodes_run(remote, server, reference, adapters):
    """Episodes on v1 and on the base model keep going while v2 is loaded and another worker unloads v1."""
    remote.load_adapter("tenant-a@v1", adapters["a"])
    turns: dict[str, list] = {"tenant-a@v1": [], "base": [], "tenant-a@v2": []}
    failures: list[BaseException] = []
    unloaded = threading.Event()

    def episode(adapter, key, n_turns=6):
        try:
            ctx = [11, 12, 13, 14]
            for turn in range(n_turns):
                if turn == 2 and adapter == "tenant-a@v1":
                    unloaded.wait(60)  # its next turns come after the other worker's unload
                gen = remote.generate([GenerationRequest(ctx, 6, 1.0, adapter, key=key)])[0]
                turns[adapter or "base"].append((list(ctx), gen))
                ctx = ctx + gen.token_ids + [15, 16]
        except BaseException as exc:
            failures.append(exc)

    running = [threading.Thread(target=episode, args=a) for a in [("tenant-a@v1", "e1"), (None, "e2")]]
    for t in running:
        t.start()
    while len(turns["tenant-a@v1"]) < 2:
        time.sleep(0.01)
    remote.load_adapter("tenant-a@v2", adapters["b"])  # the new version: new episodes start on it
    newer = threading.Thread(target=episode, args=("tenant-a@v2", "e3"))
    newer.start()
    unload = httpx.post(f"{server.url}/v1/unload_lora_adapter", json={"lora_name": "tenant-a@v1"}, headers=AUTH)
    assert unload.is_success  # another worker let v1 go while e1 still runs on it
    unloaded.set()
    for t in [*running, newer]:
        t.join(timeout=120)
    assert failures == []
    assert {"tenant-a@v1", "tenant-a@v2"} <= set(server.stats()["registered"])  # e1's backend loaded v1 again
    assert [len(v) for v in turns.values()] == [6, 6, 6]
    for adapter, local in (("tenant-a@v1", "a"), ("base", None), ("tenant-a@v2", "b")):
        for ctx, gen in turns[adapter]:
            assert gen.logprobs == pytest.approx(naive_logprobs(reference, ctx, gen.token_ids, local), abs=1e-4)
