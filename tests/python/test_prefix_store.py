"""The shared compressed prefix store (issue 24) through real `veloxquant serve` processes on SmolLM2
and a real redis-server (started here on a free loopback port in a temporary folder, stopped at the
end): a prefix one server computed is served to another (and to a restarted one) from the store with
the same tokens as a recompute; a tampered, truncated or other-spec entry is refused (counted, never
used, output unchanged); a store killed mid-run leaves the servers answering from their local cache,
and a store that comes back is used again. Skips without the model, the binary or redis-server."""
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

redis = pytest.importorskip("redis")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_util import MODEL, VQ_BIN, Server  # noqa: E402

REDIS = shutil.which("redis-server") or "/usr/bin/redis-server"
pytestmark = pytest.mark.skipif(not MODEL.exists() or not Path(VQ_BIN).exists() or not Path(REDIS).exists(),
                                reason="needs the default model, the veloxquant binary and redis-server")

KV = "kivi4,r=32"  # codes, scales and an fp16 window: every block form goes through the store


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    def __init__(self, folder, port=None):
        self.port = port or free_port()
        self.folder = folder
        self.start()

    def start(self):
        self.proc = subprocess.Popen([REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder),
                                      "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        self.client = redis.Redis(host="127.0.0.1", port=self.port)
        for _ in range(100):
            try:
                self.client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)

    def entries(self):
        return {k: self.client.get(k) for k in self.client.scan_iter("vqkv:*")}


@pytest.fixture()
def store(tmp_path):
    r = Redis(tmp_path)
    yield r
    r.kill()


def serve(store, kv=KV):
    return Server("--kv-cache", kv, "--parallel", "2", "--kv-budget", "64",
                  "--prefix-store", f"redis://127.0.0.1:{store.port}")


def generate(s, prompt, n=8):
    st, _, body = s.request("POST", "/v1/completions", {"model": "m", "prompt": prompt, "max_tokens": n,
                                                        "temperature": 0, "return_token_ids": True})
    assert st == 200, body
    return body["choices"][0]["token_ids"]


def metric(s, name):
    return s.metric(name)


def wait_written(s, n=1):
    end = time.time() + 20
    while metric(s, "vq_prefix_store_written_total") < n:
        assert time.time() < end, "nothing written to the store"
        time.sleep(0.05)


PROMPT = [1 + (i * 7919) % 40000 for i in range(200)]  # 6 full blocks + 8 tokens


def test_prefix_crosses_servers_and_restarts_through_the_store(store):
    a = serve(store)
    try:
        want = generate(a, PROMPT)
        wait_written(a)
        assert metric(a, "vq_prefix_store_hits_total") == 0
    finally:
        assert a.stop() == 0
    ents = store.entries()
    assert ents, "the prefill point was written through"
    # A second replica (and the first one restarted) takes the 192-token point from the store.
    for _ in range(2):
        b = serve(store)
        try:
            assert generate(b, PROMPT) == want, "a store hit gives the tokens of a recompute"
            assert metric(b, "vq_prefix_store_hits_total") == 1
            assert metric(b, "vq_prefix_store_adopted_tokens_total") == 192
            assert metric(b, "vq_prefix_cache_hit_tokens_total") == 192
            assert metric(b, "vq_prefix_store_fetched_bytes_total") == sum(len(v) for v in ents.values())
            # Once local, the prefix is not fetched again.
            assert generate(b, PROMPT) == want
            assert metric(b, "vq_prefix_store_lookups_total") == 1
        finally:
            assert b.stop() == 0
    # The entry holds codes: far fewer bytes than the fp16 KV of its 192 tokens (30 layers, 3 KV
    # heads x 64 x 2 (K, V) x 2 bytes), fp16 window included.
    fp16_bytes = 192 * 30 * 3 * 64 * 2 * 2
    assert max(len(v) for v in ents.values()) < fp16_bytes * 0.6


PROMPT2 = PROMPT + [3 + (i * 104729) % 40000 for i in range(100)]  # the next turn: 9 full blocks + 12 tokens


def test_a_later_turn_writes_a_delta_entry_and_is_assembled_from_its_chain(store, tmp_path):
    a = serve(store)
    try:
        want = generate(a, PROMPT)
        wait_written(a)
        want2 = generate(a, PROMPT2)
        wait_written(a, 2)
    finally:
        assert a.stop() == 0
    ents = store.entries()
    assert len(ents) == 2
    # The 288-token point as a whole entry: written by a replica that saw only the second turn.
    (tmp_path / "whole").mkdir()
    other = Redis(tmp_path / "whole")
    w = Server("--kv-cache", KV, "--parallel", "2", "--kv-budget", "64", "--prefix-store", f"redis://127.0.0.1:{other.port}")
    try:
        assert generate(w, PROMPT2) == want2
        wait_written(w)
    finally:
        assert w.stop() == 0
        whole = other.entries()
        other.kill()
    assert [len(v) for v in whole.values()] and set(whole) <= set(ents)
    deep_key = max(whole, key=lambda k: len(whole[k]))
    shallow_key = next(k for k in ents if k != deep_key)
    small, big = ents[deep_key], ents[shallow_key]
    # The delta entry holds the 3 new blocks, the window and the blocks encoded since the first turn,
    # not the whole prefix again.
    assert len(small) < len(whole[deep_key]) * 0.7, (len(small), len(whole[deep_key]))
    # A replica that never saw either turn takes the 288-token point, assembled from both entries.
    b = serve(store)
    try:
        assert generate(b, PROMPT2) == want2, "an assembled point gives the tokens of a recompute"
        assert metric(b, "vq_prefix_store_hits_total") == 1
        assert metric(b, "vq_prefix_store_adopted_tokens_total") == 288
        assert metric(b, "vq_prefix_store_fetched_bytes_total") == len(small) + len(big)
        assert generate(b, PROMPT) == want
    finally:
        assert b.stop() == 0
    # The ancestor gone (evicted): the deeper point is a miss, not an error, and the output stands.
    store.client.delete(shallow_key)
    c = serve(store)
    try:
        assert generate(c, PROMPT2) == want2
        assert metric(c, "vq_prefix_store_hits_total") == 0
        assert metric(c, "vq_prefix_store_refused_total") == 0
        assert metric(c, "vq_prefix_store_adopted_total") == 0
    finally:
        assert c.stop() == 0
    # A damaged ancestor: refused (the chain is never used) and deleted.
    store.client.set(shallow_key, ents[shallow_key][:-7] + b"1234567")
    store.client.set(deep_key, small)
    c = serve(store)
    try:
        assert generate(c, PROMPT2) == want2
        assert metric(c, "vq_prefix_store_refused_total") == 1
        assert metric(c, "vq_prefix_store_hits_total") == 0
        assert "refused prefix store entry" in "".join(c.log)
        assert store.client.get(shallow_key) is None
    finally:
        assert c.stop() == 0


@pytest.mark.parametrize("damage", ["flip", "envelope", "bare_session", "truncate", "other_spec"])
def test_bad_entries_are_refused_and_never_used(store, damage):
    a = serve(store)
    try:
        want = generate(a, PROMPT)
        wait_written(a)
    finally:
        assert a.stop() == 0
    (key, val), = store.entries().items()
    if damage == "flip":
        bad = bytearray(val)
        bad[len(bad) // 2] ^= 0x40  # a payload byte: the SHA-256 no longer matches
        bad = bytes(bad)
    elif damage == "envelope":
        bad = bytearray(val)
        bad[20] ^= 0x01  # the ancestor's depth: the envelope's SHA-256 no longer matches
        bad = bytes(bad)
    elif damage == "bare_session":
        bad = val[24 + 32:]  # the session file without its envelope, as builds before delta entries wrote
    elif damage == "truncate":
        bad = val[:len(val) - 1000]
    else:
        # The same prompt's point made under another spec (kivi2), put under this spec's key: its
        # header names another spec checksum.
        other = serve(store, kv="kivi2,r=32")
        try:
            generate(other, PROMPT)
            wait_written(other)
        finally:
            assert other.stop() == 0
        bad = next(v for k, v in store.entries().items() if k != key)
    store.client.set(key, bad)
    b = serve(store)
    try:
        assert generate(b, PROMPT) == want, "a refused entry changes nothing"
        assert metric(b, "vq_prefix_store_refused_total") == 1
        assert metric(b, "vq_prefix_store_hits_total") == 0
        assert metric(b, "vq_prefix_store_adopted_total") == 0
        assert metric(b, "vq_prefix_cache_hit_tokens_total") == 0
        assert "refused prefix store entry" in "".join(b.log)
    finally:
        assert b.stop() == 0


def test_store_killed_mid_run_degrades_to_local_caching(store):
    a = serve(store)
    try:
        want = generate(a, PROMPT)
        wait_written(a)
        store.kill()
        # New prompts (a miss locally: the store is asked and does not answer) and the cached one.
        other = [p + 1 for p in PROMPT]
        t0 = time.time()
        generate(a, other)
        assert generate(a, PROMPT) == want
        assert time.time() - t0 < 30
        assert metric(a, "vq_prefix_store_up") == 0
        assert metric(a, "vq_prefix_store_errors_total") >= 1
        assert metric(a, "vq_prefix_cache_hit_tokens_total") >= 192, "the local cache still serves"
        # The store comes back (empty): after the retry pause, new points are written again.
        store.start()
        time.sleep(1.2)
        third = [p + 2 for p in PROMPT]
        generate(a, third)
        time.sleep(1.2)
        generate(a, [p + 3 for p in PROMPT])
        wait_written(a, 2)
        assert metric(a, "vq_prefix_store_up") == 1
        assert store.entries()
    finally:
        assert a.stop() == 0
