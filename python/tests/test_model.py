"""Model, tokenizer, sessions, generation and perplexity on the default model (SmolLM2-135M)."""
import numpy as np
import pytest

import veloxquant as vq

TEXT = ("The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single "
        "step. All that glitters is not gold. Actions speak louder than words. ") * 12  # ~500 tokens


def test_model_info_and_tokenizer(model):
    assert model.is_default and model.arch == "llama"
    assert (model.n_layers, model.n_kv_heads, model.head_dim) == (30, 3, 64)
    tok = model.tokenizer
    ids = tok.encode("Hello world")
    assert tok.decode(ids) == "Hello world"
    assert b"".join(tok.piece(i) for i in ids) == b"Hello world"
    assert tok.chat_format == "chatml"
    prompt = tok.apply_chat_template([("user", "Hi")])
    assert prompt.endswith("<|im_start|>assistant\n")
    # The chat markers are parsed as special tokens: one id each.
    assert len(tok.encode("<|im_start|>", add_bos=False)) == 1
    assert len(tok.encode("<|im_start|>", add_bos=False, parse_special=False)) > 1


def greedy_by_hand(model, spec, ids, n):
    """Greedy decoding through a Session, one forward call per token, the sampler checked against argmax."""
    s = vq.Session(model, spec, n_ctx=len(ids) + n)
    sampler = vq.Sampler(temperature=0)
    logits = s.forward(np.asarray(ids, dtype=np.int32))
    out = []
    for _ in range(n):
        t = int(np.argmax(logits[-1]))
        assert sampler.sample(logits[-1]) == t
        out.append(t)
        if model.tokenizer.is_end_of_generation(t) or len(out) == n:
            break  # the last token need not go through the model
        logits = s.forward([t])
    return out, s


def test_generate_equals_session_argmax(model):
    ids = model.tokenizer.encode("The capital of France is")
    g = model.generate(ids, max_new_tokens=8, temperature=0)
    ref, session = greedy_by_hand(model, vq.KVSpec("fp16"), ids, 8)
    assert g.tokens == ref
    assert g.n_prompt == len(ids) and g.n_generated == len(ref)
    assert g.finish_reason in ("length", "eos")
    # Memory: fp16 tokens take what fp16 takes; the session's figures agree with the engine's.
    assert g.memory.token_bytes == g.memory.fp16_bytes and g.memory.bits_per_element == pytest.approx(16)
    assert session.memory.fp16_bytes > 0 and session.pos == len(ids) + len(ref) - 1


def test_session_logits_shapes_and_reset(model):
    s = vq.Session(model, vq.KVSpec("q8_0"), n_ctx=64)
    ids = np.asarray(model.tokenizer.encode(TEXT)[:20], dtype=np.int32)
    all_logits = s.forward(ids, all_logits=True)
    assert all_logits.shape == (20, model.n_vocab) and all_logits.dtype == np.float32
    assert s.pos == 20
    s.reset()
    last = s.forward(ids)
    assert last.shape == (1, model.n_vocab)
    np.testing.assert_array_equal(last[0], all_logits[-1])  # chunking does not change results
    with pytest.raises(vq.Error, match="out of range"):
        s.forward([model.n_vocab])
    with pytest.raises(vq.Error):
        s.forward(np.arange(60, dtype=np.int32))  # past n_ctx


def test_generate_batch_equals_one_by_one(model):
    prompts = ["Once upon a time", "The best way to learn", "Water boils at"]
    batch = model.generate_batch(prompts, max_new_tokens=5, temperature=0, parallel=3, kv_cache="q8_0")
    assert len(batch) == 3
    for p, b in zip(prompts, batch):
        one = model.generate(p, max_new_tokens=5, temperature=0, kv_cache="q8_0")
        assert b.tokens == one.tokens and b.text == one.text


def test_kv_budget(model):
    ids = model.tokenizer.encode(TEXT)[:100]
    s = vq.Session(model, vq.KVSpec("fp16"), n_ctx=256, kv_budget_bytes=4096)
    with pytest.raises(vq.Error, match="budget|pool"):
        s.forward(ids)
    assert s.pos == 0
    g = model.generate(ids, max_new_tokens=4, kv_budget_bytes=4096)
    assert g.finish_reason == "error" and "budget" in g.error and g.tokens == []


def test_on_token_streams_and_stops(model):
    seen = []

    def on_token(t):
        seen.append(t)
        return len(seen) < 3

    g = model.generate("Count: one, two,", max_new_tokens=20, temperature=0, ignore_eos=True, on_token=on_token)
    assert seen == g.tokens and len(seen) == 3 and g.finish_reason == "stop"


def test_vecinfer_with_in_memory_calibration(model):
    cal = vq.Calibration.from_model(model, TEXT, max_tokens=256, kv_cache="vecinfer:d4b8,gran=shared",
                                    kmeans_iters=4)
    assert (cal.n_layers, cal.n_kv_heads, cal.head_dim) == (30, 3, 64)
    # The tokens after the 256 trained on make the held-out check (the text has more than 64 left).
    chk = cal.held_out_check
    assert chk is not None and 64 <= chk["tokens"] <= 1024
    assert 0 <= chk["kl"] < 5 and 0 <= chk["top1"] <= 1 and chk["ppl_ratio"] > 0
    assert cal.key_mean_tokens == 16  # the rotated key mean, the default
    plain = vq.Calibration.from_model(model, TEXT, max_tokens=256, kv_cache="vecinfer:d4b8,gran=shared",
                                      kmeans_iters=1, held_out_tokens=0, key_mean_tokens=0)
    assert plain.held_out_check is None and plain.key_mean_tokens == 0
    assert cal.key_transform == "hadamard"  # auto: shared books keep the Walsh-Hadamard rotation
    few = vq.Calibration.from_model(model, TEXT, max_tokens=256, kv_cache="vecinfer:d4b6", kmeans_iters=1,
                                    held_out_tokens=0)
    assert few.key_transform == "hadamard"  # auto: 256 tokens are too few for 64 x 64 covariances
    learned = vq.Calibration.from_model(model, TEXT, max_tokens=256, kv_cache="vecinfer:d4b6", kmeans_iters=2,
                                        held_out_tokens=0, key_transform="learned")
    assert learned.key_transform == "learned"
    g = model.generate(model.tokenizer.encode(TEXT)[:200], max_new_tokens=2, temperature=0,
                       kv_cache=vq.KVSpec("vecinfer:d4b6,r=16,sink=4", learned))
    assert len(g.tokens) == 2
    with pytest.raises(vq.Error, match="key_transform 'rotated' must be auto, hadamard or learned"):
        vq.Calibration.from_model(model, TEXT, max_tokens=256, kv_cache="vecinfer:d4b6", key_transform="rotated")
    spec = vq.KVSpec("vecinfer:d4b8,gran=shared,r=32,sink=4", cal)
    long_prompt = model.tokenizer.encode(TEXT)[:400]
    g = model.generate(long_prompt, max_new_tokens=4, temperature=0, kv_cache=spec)
    m = g.memory
    # 400 tokens: the sink block and the fp16 window (under 100 tokens) in fp16, the rest at 2 bits.
    assert m.token_bytes < 0.5 * m.fp16_bytes and m.saved_fraction > 0.5
    assert 2.0 < m.bits_per_element < 8.0
    with pytest.raises(vq.Error):  # a calibration of another geometry is refused before any work
        keys = [np.zeros((300, 2, 16), np.float32) + 1] * 2
        other = vq.Calibration.train(keys, keys, kv_cache="vecinfer:d4b8,gran=shared", kmeans_iters=1)
        model.generate("x", max_new_tokens=1, kv_cache=vq.KVSpec("vecinfer:d4b8,gran=shared", other))


def test_perplexity(model):
    same = model.perplexity(TEXT, kv_cache="fp16", reference="fp16", n_ctx=64)
    assert same.n_scored == 63
    assert same.kl == pytest.approx(0, abs=1e-9) and same.top1 == 1.0
    assert same.perplexity == pytest.approx(same.ref_perplexity)
    assert 1.0 < same.perplexity < 50.0  # a repeated English text is easy for the model
    q = model.perplexity(TEXT, kv_cache="q4_0", reference="fp16", n_ctx=64)
    assert q.kl > 0 and q.memory.bits_per_element == pytest.approx(4.5)
    alone = model.perplexity(TEXT, kv_cache="q4_0", reference=None, n_ctx=64)
    assert alone.kl == 0 and alone.perplexity == pytest.approx(q.perplexity)


def test_engine_callbacks_fork_and_cancel(model):
    tok = model.tokenizer
    prompt = tok.encode("List three colours:")
    engine = vq.Engine(model, vq.KVSpec("q8_0"), max_sequences=4)
    streams, done = {}, {}

    def on_token(i, t):
        streams.setdefault(i, []).append(t)  # returns None: go on

    def on_finish(r):
        done[r.id] = r

    a = engine.submit(prompt, max_new_tokens=6, temperature=0, ignore_eos=True, on_token=on_token, on_finish=on_finish)
    b = engine.submit(prompt, max_new_tokens=6, temperature=0, ignore_eos=True, fork_of=a, on_token=on_token,
                      on_finish=on_finish)
    c = engine.submit(tok.encode("Never runs"), max_new_tokens=6, on_finish=on_finish)
    engine.cancel(c)
    engine.run()
    assert engine.idle and engine.memory_used_bytes == 0 and engine.memory_peak_bytes > 0
    assert done[c].finish_reason == "cancelled" and done[c].n_generated == 0
    # The fork shares the prompt's blocks and, greedy, produces the same tokens as its parent and as
    # a plain generate.
    assert streams[a] == streams[b] == model.generate(prompt, max_new_tokens=6, temperature=0, ignore_eos=True,
                                                      kv_cache="q8_0").tokens
    assert done[a].finish_reason == done[b].finish_reason == "length" and done[b].memory.fp16_bytes > 0


def test_engine_prefix_cache_and_deterministic(model):
    tok = model.tokenizer
    shared = tok.encode("A shared system prompt long enough to fill whole blocks of the pool: answer briefly, "
                        "plainly, and say when you do not know. Name your sources when you have them, and say so "
                        "when you have none; never make up a fact. Question:")
    assert len(shared) > 40

    def run(engine, q):
        out = []
        engine.submit(shared + tok.encode(q, add_bos=False), max_new_tokens=4, temperature=0, ignore_eos=True,
                      on_token=lambda i, t: out.append(t))
        engine.run()
        return out

    cold = vq.Engine(model, vq.KVSpec("fp16"), max_step_tokens=32, deterministic=True)
    warm = vq.Engine(model, vq.KVSpec("fp16"), max_step_tokens=32, deterministic=True, prefix_cache=True)
    assert run(warm, " the sun?") == run(cold, " the sun?") and warm.prefix_hit_tokens == 0
    assert run(warm, " the moon?") == run(cold, " the moon?")
    assert warm.prefix_hit_tokens >= 32 and cold.prefix_hit_tokens == 0


def test_server_serves_completions_and_stops(model, tmp_path):
    """veloxquant.Server from Python: port 0 binds a free port, run() in a thread serves the
    OpenAI-compatible API (greedy text equal to Model.generate's), stop() ends run(); a bad option
    is refused naming it."""
    import http.client
    import json
    import threading

    server = vq.Server(model, vq.KVSpec("q8_0"), port=0, session_dir=str(tmp_path / "sessions"),
                       max_sequences=2)
    assert server.port == -1
    port = server.bind()
    assert port > 0 and server.port == port
    t = threading.Thread(target=server.run)
    t.start()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        c.request("GET", "/health")
        r = c.getresponse()
        r.read()
        assert r.status == 200
        ids = model.tokenizer.encode("The capital of France is")
        body = {"model": server.model_name, "prompt": ids, "max_tokens": 8, "temperature": 0,
                "ignore_eos": True, "return_token_ids": True}
        c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        assert r.status == 200
        got = json.loads(r.read())["choices"][0]["token_ids"]
        want = model.generate(ids, max_new_tokens=8, temperature=0, kv_cache="q8_0", ignore_eos=True).tokens
        assert got == list(want) and len(got) == 8
    finally:
        server.stop()
        t.join(timeout=60)
    assert not t.is_alive()
    with pytest.raises(vq.Error, match="max_sequences"):
        vq.Server(model, vq.KVSpec("fp16"), port=0, max_sequences=0)
