"""`veloxquant serve` through the official openai client on a free loopback port: completion,
chat, streaming, stop strings, concurrent greedy outputs equal to one-at-a-time outputs, prefix
hits equal to misses, sessions saved and restored across a restart, the bad-request matrix,
429 past the queue, a vanished streaming client, metrics, and a bounded load test (32 clients,
200 requests, nothing lost or mixed up). Skips when the default model is absent."""
import concurrent.futures as cf
import json
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_util import MODEL, VQ_BIN, Server  # noqa: E402

pytestmark = pytest.mark.skipif(not MODEL.exists() or not Path(VQ_BIN).exists(),
                                reason=f"needs the default model ({MODEL}) and the veloxquant binary")

# KIVI 4-bit with a 32-token fp16 window: short prompts already hold both forms (codes and window),
# so prefix hits and session files carry codes, scales and fp16 blocks.
KV = "kivi4,r=32"
PROMPTS = [f"Question {i}: name {['a colour', 'an animal', 'a city', 'a fruit', 'a tool'][i % 5]} "
           f"and say why it matters in {i + 2} words." for i in range(20)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server("--kv-cache", KV, "--parallel", "8", "--kv-budget", "256", "--max-queue", "64",
               session_dir=tmp_path_factory.mktemp("sessions"))
    yield s
    assert s.stop() == 0, "".join(s.log)


@pytest.fixture(scope="module")
def cold(tmp_path_factory):
    """No prefix cache, one sequence at a time, a queue of one: the reference for hit == miss, and 429."""
    s = Server("--kv-cache", KV, "--parallel", "1", "--max-queue", "1", "--no-prefix-cache", "--kv-budget", "256")
    yield s
    assert s.stop() == 0, "".join(s.log)


def complete(c, prompt, n=12, **kw):
    r = c.completions.create(model="m", prompt=prompt, max_tokens=n, temperature=0, **kw)
    return r.choices[0]


def test_completion_chat_and_models(server):
    c = server.client()
    ch = complete(c, "The capital of France is", n=8)
    assert ch.text and ch.finish_reason in ("length", "stop")
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Say hello."}],
                                  max_tokens=16, temperature=0)
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.usage.prompt_tokens > 5 and 0 < r.usage.completion_tokens <= 16
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    models = c.models.list().data
    assert [m.id for m in models] == [MODEL.name[:-len(".gguf")]]
    assert server.request("GET", "/health")[0] == 200


def test_streaming_equals_plain(server):
    c = server.client()
    plain = complete(c, PROMPTS[0], n=20).text
    parts = [e.choices[0].text for e in c.completions.create(model="m", prompt=PROMPTS[0], max_tokens=20,
                                                            temperature=0, stream=True) if e.choices]
    assert "".join(parts) == plain and len(parts) > 1
    msgs = [{"role": "user", "content": PROMPTS[1]}]
    chat_plain = c.chat.completions.create(model="m", messages=msgs, max_tokens=20, temperature=0)
    events = list(c.chat.completions.create(model="m", messages=msgs, max_tokens=20, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(e.choices[0].delta.content or "" for e in events if e.choices)
    assert text == chat_plain.choices[0].message.content
    assert events[0].choices[0].delta.role == "assistant"
    assert [e.choices[0].finish_reason for e in events if e.choices][-1] == chat_plain.choices[0].finish_reason
    assert events[-1].usage.completion_tokens == chat_plain.usage.completion_tokens


def test_logprobs(server):
    c = server.client()
    ch = complete(c, PROMPTS[5], n=6, logprobs=3)
    lp = ch.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert "".join(lp.tokens) == ch.text and lp.text_offset[0] == 0
    for chosen, tok, top in zip(lp.token_logprobs, lp.tokens, lp.top_logprobs):
        assert len(top) == 3 and chosen <= 0
        assert abs(chosen - max(top.values())) < 1e-6 and top[tok] == chosen, "greedy takes the most likely token"
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                  temperature=0, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens and all(len(e.top_logprobs) == 2 for e in content)
    assert bytes(b for e in content for b in e.bytes).decode() == r.choices[0].message.content


def test_stop_strings_spanning_tokens_are_cut(server):
    c = server.client()
    full = complete(c, PROMPTS[2], n=32).text
    assert len(full) > 12, full
    stop = full[5:11]  # a piece from inside the text, most likely across token boundaries
    cut = full[:full.index(stop)]
    ch = complete(c, PROMPTS[2], n=32, stop=[stop, "\x00never"])
    assert (ch.text, ch.finish_reason) == (cut, "stop")
    streamed = "".join(e.choices[0].text for e in c.completions.create(
        model="m", prompt=PROMPTS[2], max_tokens=32, temperature=0, stop=stop, stream=True) if e.choices)
    assert streamed == cut


def test_concurrent_greedy_equals_one_at_a_time(server, cold):
    alone = [complete(cold.client(), p, n=10).text for p in PROMPTS[:6]]
    c = server.client()
    with cf.ThreadPoolExecutor(6) as ex:
        together = list(ex.map(lambda p: complete(c, p, n=10).text, PROMPTS[:6]))
    assert together == alone


def test_prefix_hit_equals_miss(server, cold):
    shared = " ".join(f"Fact {i}: the number {i} follows {i - 1}." for i in range(1, 30))  # ~300 tokens
    prompts = [shared + " Now count from 3.", shared + " Now name a prime.", shared + " Now count from 3."]
    hits0 = server.metric("vq_prefix_cache_hit_tokens_total")
    warm = []
    for p in prompts:
        warm.append(complete(server.client(), p, n=12).text)
    reused = server.metric("vq_prefix_cache_hit_tokens_total") - hits0
    assert reused >= 2 * 256, f"the shared prefix should have been reused twice (got {reused} tokens)"
    assert warm == [complete(cold.client(), p, n=12).text for p in prompts]


def test_small_budget_queues_and_preempts_without_changing_outputs(cold):
    """A pool that holds about two of these sequences: the rest wait or are preempted and recomputed;
    every output still equals the one-at-a-time output."""
    prompts = [" ".join(f"{w}{i}" for w in PROMPTS[i].split()) * 6 for i in range(6)]  # ~300 tokens each
    s = Server("--kv-cache", KV, "--kv-budget", "8", "--parallel", "6")
    try:
        c = s.client()
        with cf.ThreadPoolExecutor(6) as ex:
            got = list(ex.map(lambda p: complete(c, p, n=24).text, prompts))
        squeezed = s.metric("vq_engine_preemptions_total") + s.metric("vq_prefix_cache_evictions_total")
        assert s.metric("vq_kv_pool_used_bytes") <= 8 * 1048576
    finally:
        assert s.stop() == 0, "".join(s.log)
    assert got == [complete(cold.client(), p, n=24).text for p in prompts]
    assert squeezed > 0, "the budget should have forced evictions or preemptions"


def test_session_save_restore_across_restart(tmp_path):
    sdir = tmp_path / "sessions"
    sdir.mkdir()  # serve --session-dir names an existing folder (issue 26)
    prompt_ids = list(range(1000, 1090))  # token ids: no re-tokenization between turns
    more_ids = list(range(2000, 2012))
    s1 = Server("--kv-cache", KV, "--kv-budget", "256", session_dir=sdir)
    try:
        c = s1.client()
        first = c.completions.create(model="m", prompt=prompt_ids, max_tokens=10, temperature=0,
                                     extra_body={"session": "conv-1", "return_token_ids": True})
        ids = first.choices[0].model_extra["token_ids"]
        assert len(ids) == 10
        turn2 = prompt_ids + ids + more_ids
        expect = complete(c, turn2, n=12).text
        st, _, body = s1.request("POST", "/v1/sessions/conv-1/save")
        assert st == 200 and body["n_kv"] == len(prompt_ids) + len(ids) - 1, body
        assert (sdir / "conv-1.vqkv").exists()
        st, _, listed = s1.request("GET", "/v1/sessions")
        assert [x["id"] for x in listed["data"]] == ["conv-1"]
    finally:
        assert s1.stop() == 0, "".join(s1.log)
    s2 = Server("--kv-cache", KV, "--kv-budget", "256", session_dir=sdir)
    try:
        st, _, body = s2.request("POST", "/v1/sessions/conv-1/restore")
        assert st == 200 and body["n_kv"] == len(prompt_ids) + len(ids) - 1, body
        hits0 = s2.metric("vq_prefix_cache_hit_tokens_total")
        assert complete(s2.client(), turn2, n=12).text == expect
        assert s2.metric("vq_prefix_cache_hit_tokens_total") - hits0 == body["n_kv"], "the turn starts at the session"
        # Refusals: unknown, corrupted, bad names.
        assert s2.request("POST", "/v1/sessions/none/restore")[0] == 404
        data = bytearray((sdir / "conv-1.vqkv").read_bytes())
        data[len(data) // 2] ^= 0x55
        (sdir / "bad.vqkv").write_bytes(bytes(data))
        st, _, body = s2.request("POST", "/v1/sessions/bad/restore")
        assert st == 422 and "checksum" in body["error"]["message"], body
        (sdir / "short.vqkv").write_bytes((sdir / "conv-1.vqkv").read_bytes()[:-50])
        st, _, body = s2.request("POST", "/v1/sessions/short/restore")
        assert st == 422 and "truncated" in body["error"]["message"], body
        assert s2.request("POST", "/v1/sessions/..%2Fx/save")[0] in (400, 404)
        assert s2.request("DELETE", "/v1/sessions/conv-1")[0] == 200
        assert s2.request("POST", "/v1/sessions/conv-1/save")[0] == 404
    finally:
        assert s2.stop() == 0, "".join(s2.log)


BAD = [
    ("malformed JSON", b'{"prompt": "x", ', "malformed JSON"),
    ("invalid UTF-8", b'{"prompt": "\xff\xfe", "max_tokens": 2}', "malformed JSON"),
    ("not an object", b'[1, 2]', "JSON object"),
    ("unknown field", {"prompt": "x", "max_tokens": 2, "frobnicate": 1}, "unknown field 'frobnicate'"),
    ("missing prompt", {"max_tokens": 2}, "'prompt' is required"),
    ("empty prompt", {"prompt": "", "max_tokens": 2}, "must not be empty"),
    ("token id out of range", {"prompt": [1, 99999999], "max_tokens": 2}, "'prompt'"),
    ("negative max_tokens", {"prompt": "x", "max_tokens": -1}, "'max_tokens'"),
    ("zero max_tokens", {"prompt": "x", "max_tokens": 0}, "'max_tokens'"),
    ("huge max_tokens", {"prompt": "x", "max_tokens": 10 ** 12}, "'max_tokens'"),
    ("max_tokens past the context", {"prompt": "x", "max_tokens": 10 ** 6}, "context"),
    ("max_tokens a string", {"prompt": "x", "max_tokens": "5"}, "integer"),
    ("temperature too high", {"prompt": "x", "temperature": 3}, "'temperature'"),
    ("top_p negative", {"prompt": "x", "top_p": -0.1}, "'top_p'"),
    ("n > 1", {"prompt": "x", "n": 2}, "'n'"),
    ("echo", {"prompt": "x", "echo": True}, "'echo'"),
    ("stop not strings", {"prompt": "x", "stop": [1]}, "'stop'"),
    ("too many stops", {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "at most 4"),
    ("empty stop", {"prompt": "x", "stop": [""]}, "empty"),
    ("stream not bool", {"prompt": "x", "stream": "yes"}, "'stream'"),
    ("bad session name", {"prompt": "x", "session": "../etc"}, "'session'"),
    ("logprobs past 5", {"prompt": "x", "logprobs": 6}, "'logprobs'"),
    ("top_logprobs on completions", {"prompt": "x", "top_logprobs": 2}, "'top_logprobs'"),
]


@pytest.mark.parametrize("name,body,needle", BAD, ids=[b[0] for b in BAD])
def test_bad_completion_requests(server, name, body, needle):
    st, _, out = server.request("POST", "/v1/completions", body)
    assert st == 400, (st, out)
    assert needle in out["error"]["message"], out
    assert out["error"]["type"] in ("invalid_request_error", "context_length_exceeded")


def test_bad_requests_elsewhere(server):
    chat_bad = [{"messages": []}, {"messages": [{"role": "robot", "content": "x"}]},
                {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
                {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
                {"prompt": "x"}]
    for b in chat_bad:
        st, _, out = server.request("POST", "/v1/chat/completions", b)
        assert st == 400 and "error" in out, (b, st, out)
    st, _, out = server.request("POST", "/v1/completions", b'{"prompt": "' + b"a" * (5 << 20) + b'"}')
    assert st == 413 and out["error"]["code"] == 413
    st, _, out = server.request("GET", "/v1/nothing")
    assert st == 404 and "error" in out
    assert server.request("POST", "/v1/sessions/nobody/save")[0] == 404
    # A client that sends half a request and goes away, then one that never reads its stream.
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro")
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        body = json.dumps({"prompt": "Tell a long story.", "max_tokens": 400, "stream": True, "ignore_eos": True})
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                  f"Content-Type: application/json\r\n\r\n{body}".encode())
        assert b"200 OK" in s.recv(4096)
    # The vanished stream is cancelled at its next write: its blocks go back, nothing stays in flight.
    deadline = time.time() + 30
    while server.metric("vq_requests_in_flight") > 0 and time.time() < deadline:
        time.sleep(0.2)
    assert server.metric("vq_requests_in_flight") == 0
    assert server.metric("vq_requests_running") == 0
    assert server.request("GET", "/health")[0] == 200, "the server survives all of it"


def test_queue_full_gives_429(cold):
    import openai
    c = cold.client()

    def one(i):
        try:
            c.completions.create(model="m", prompt=PROMPTS[i], max_tokens=40, temperature=0,
                                 extra_body={"ignore_eos": True})
            return 200, None
        except openai.RateLimitError as e:
            return 429, e.response.headers.get("retry-after")

    with cf.ThreadPoolExecutor(5) as ex:
        got = list(ex.map(one, range(5)))
    codes = [g[0] for g in got]
    assert codes.count(429) >= 1 and codes.count(200) >= 2, codes
    assert all(ra == "1" for code, ra in got if code == 429)
    assert cold.request("GET", "/health")[0] == 200


def test_metrics_present(server):
    complete(server.client(), PROMPTS[3], n=4)
    _, headers, text = server.request("GET", "/metrics")
    for name in ["vq_requests_total{endpoint=\"/v1/completions\",status=\"200\"}", "vq_prompt_tokens_total",
                 "vq_generated_tokens_total", "vq_queue_length", "vq_kv_pool_used_bytes", "vq_kv_pool_budget_bytes",
                 "vq_prefix_cache_hits_total", "vq_engine_step_seconds_total",
                 "vq_time_to_first_token_seconds_bucket{le=\"+Inf\"}"]:
        assert name in text, name
    assert server.metric("vq_kv_pool_budget_bytes") == 256 * 1048576
    assert server.metric("vq_generated_tokens_total") >= 4
    assert server.metric("vq_time_to_first_token_seconds_count") >= 1
    # The same state under vLLM's names, labelled with the model (what routers and autoscalers read).
    for name in ["vllm:num_requests_running{model_name=", "vllm:num_requests_waiting{model_name=",
                 "vllm:kv_cache_usage_perc{model_name=", "vllm:prefix_cache_queries_total{model_name=",
                 "vllm:prefix_cache_hits_total{model_name=", "vllm:generation_tokens_total{model_name=",
                 "vllm:time_to_first_token_seconds_count{model_name="]:
        assert name in text, name
    vals = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("vllm:") and "_bucket" not in line}
    assert 0 <= vals["vllm:kv_cache_usage_perc"] <= 1
    assert vals["vllm:generation_tokens_total"] == server.metric("vq_generated_tokens_total")
    assert vals["vllm:prefix_cache_queries_total"] >= vals["vllm:prefix_cache_hits_total"] >= 0


def test_load_32_clients_200_requests(server):
    """Each client sends its requests one after another; every answer must be its own prompt's."""
    c = server.client()
    expect = {i: complete(c, PROMPTS[i], n=8, seed=i).text for i in range(len(PROMPTS))}
    jobs = [(k % len(PROMPTS)) for k in range(200)]

    def client(ci):
        out = []
        for k in range(ci, 200, 32):
            i = jobs[k]
            out.append((k, i, complete(c, PROMPTS[i], n=8, seed=i).text))
        return out

    t0 = time.time()
    with cf.ThreadPoolExecutor(32) as ex:
        results = [r for rs in ex.map(client, range(32)) for r in rs]
    assert len(results) == 200 and sorted(k for k, _, _ in results) == list(range(200))
    wrong = [(k, i) for k, i, text in results if text != expect[i]]
    assert not wrong, f"{len(wrong)} answers differ from their prompt's: {wrong[:5]}"
    assert time.time() - t0 < 300


def test_sigterm_lets_running_requests_finish_and_exits_0():
    s = Server("--kv-cache", KV, "--kv-budget", "128")
    events = s.client().completions.create(model="m", prompt=PROMPTS[4], max_tokens=48, temperature=0, stream=True,
                                           stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    first = next(iter(events))
    s.proc.send_signal(signal.SIGTERM)
    rest = list(events)
    assert [e.choices[0].finish_reason for e in rest if e.choices][-1] == "length", "the stream ran to its end"
    # Every one of the 48 tokens was generated and sent (counted by the server's usage, not by text
    # events: a lagging writer may send several tokens' text in one event).
    assert first.choices and [e.usage.completion_tokens for e in rest if e.usage][-1] == 48
    assert s.stop() == 0, "".join(s.log)
    assert any("SIGTERM: stopping" in line for line in s.log)
