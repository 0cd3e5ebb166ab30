"""`veloxquant serve --tp 3` (SmolLM2's 9 query / 3 KV heads split over 3 ranks, simulated on the
CPU): concurrent greedy completions equal one-at-a-time ones, a repeated prompt hits the prefix
cache and gives the same text, a session saved at tp 3 restores across a restart at tp 3 and
continues exactly, and is refused (422 naming --tp 3) by a tp 1 server; --tp with the shared
prefix store or the deterministic mode is one clear line. Skips when the default model is absent."""
import concurrent.futures as cf
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_util import MODEL, VQ_BIN, Server  # noqa: E402

pytestmark = pytest.mark.skipif(not MODEL.exists() or not Path(VQ_BIN).exists(),
                                reason=f"needs the default model ({MODEL}) and the veloxquant binary")
KV = "kivi4,r=32"


def complete(c, prompt, n=12):
    r = c.completions.create(model="m", prompt=prompt, max_tokens=n, temperature=0)
    return r.choices[0].text


def test_serve_tp3_batches_caches_and_keeps_sessions(tmp_path):
    sdir = tmp_path / "sessions"
    sdir.mkdir()
    prompts = [list(range(1000 + 7 * i, 1060 + 7 * i)) for i in range(4)]
    s = Server("--kv-cache", KV, "--kv-budget", "256", "--parallel", "4", "--tp", "3", session_dir=sdir)
    try:
        c = s.client()
        alone = [complete(c, p) for p in prompts]
        with cf.ThreadPoolExecutor(4) as ex:
            together = list(ex.map(lambda p: complete(s.client(), p), prompts))
        assert together == alone
        hits0 = s.metric("vq_prefix_cache_hit_tokens_total")
        assert complete(c, prompts[0]) == alone[0]
        assert s.metric("vq_prefix_cache_hit_tokens_total") > hits0, "the repeated prompt starts from the cache"
        first = c.completions.create(model="m", prompt=prompts[1], max_tokens=8, temperature=0,
                                     extra_body={"session": "conv", "return_token_ids": True})
        ids = first.choices[0].model_extra["token_ids"]
        turn2 = prompts[1] + ids + list(range(2000, 2010))
        expect = complete(c, turn2)
        st, _, body = s.request("POST", "/v1/sessions/conv/save")
        assert st == 200, body
        assert (sdir / "conv.vqkv").read_bytes()[:8] == b"VQKVTPS\0"
    finally:
        assert s.stop() == 0, "".join(s.log)
    s2 = Server("--kv-cache", KV, "--kv-budget", "256", "--tp", "3", session_dir=sdir)
    try:
        st, _, body = s2.request("POST", "/v1/sessions/conv/restore")
        assert st == 200, body
        hits0 = s2.metric("vq_prefix_cache_hit_tokens_total")
        assert complete(s2.client(), turn2) == expect
        assert s2.metric("vq_prefix_cache_hit_tokens_total") - hits0 == body["n_kv"]
    finally:
        assert s2.stop() == 0, "".join(s2.log)
    s1 = Server("--kv-cache", KV, "--kv-budget", "256", session_dir=sdir)
    try:
        st, _, body = s1.request("POST", "/v1/sessions/conv/restore")
        assert st == 422 and "--tp 3" in body["error"]["message"], body
    finally:
        assert s1.stop() == 0, "".join(s1.log)


def test_serve_tp_refusals():
    for extra, needle in ((["--tp", "3", "--prefix-store", "redis://127.0.0.1:1"], "prefix store"),
                          (["--tp", "3", "--deterministic"], "--deterministic"), (["--tp", "0"], "--tp: 0"),
                          (["--tp", "2"], "9 attention heads")):
        args = [VQ_BIN, "serve", "-m", str(MODEL), "--port", "0", *extra]
        r = subprocess.run(args, capture_output=True, text=True, timeout=120)
        assert r.returncode == 1, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], r.stderr
