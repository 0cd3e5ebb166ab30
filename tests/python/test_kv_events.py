"""KV events in vLLM's format (issue 24): a real `veloxquant serve` on SmolLM2 publishes its prefix
cache's blocks over ZMQ; this subscriber decodes them with msgpack as vLLM's array-like msgspec
structs (KVEventBatch = [ts, events, dp_rank]; BlockStored / BlockRemoved / AllBlocksCleared tagged
arrays) and checks them against the token ids it sent, then asks the ROUTER replay socket for the
batches again. Skips when the default model is absent."""
import socket
import sys
import time
from pathlib import Path

import pytest

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_util import MODEL, VQ_BIN, Server  # noqa: E402

pytestmark = pytest.mark.skipif(not MODEL.exists() or not Path(VQ_BIN).exists(),
                                reason=f"needs the default model ({MODEL}) and the veloxquant binary")

B = 32  # block_tokens


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def decode_batch(payload):
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    assert isinstance(batch, list) and len(batch) == 3, batch
    ts, events, rank = batch
    assert isinstance(ts, float) and abs(ts - time.time()) < 600 and rank == 0
    for e in events:
        assert e[0] in ("BlockStored", "BlockRemoved", "AllBlocksCleared"), e
        if e[0] == "BlockStored":
            assert len(e) == 7, e
            hashes, parent, tokens, block_size, lora_id, medium = e[1:]
            assert block_size == B and lora_id is None and medium == "CPU"
            assert len(tokens) == B * len(hashes) and hashes
            assert parent is None or isinstance(parent, int)
        elif e[0] == "BlockRemoved":
            assert len(e) == 3 and e[1] and e[2] == "CPU", e
        else:
            assert len(e) == 1, e
    return events


class Subscriber:
    """SUB bound on a loopback port (the server's PUB connects, as vLLM's does to a non-wildcard
    endpoint); keeps every (seq, payload) in order."""

    def __init__(self, ctx):
        self.port = free_port()
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"kv")
        self.sock.bind(f"tcp://127.0.0.1:{self.port}")
        self.got = []

    def pump(self, seconds):
        end = time.time() + seconds
        while time.time() < end:
            if self.sock.poll(50):
                topic, seq, payload = self.sock.recv_multipart()
                assert topic == b"kv" and len(seq) == 8
                self.got.append((int.from_bytes(seq, "big"), payload))

    def events(self):
        return [e for _, p in self.got for e in decode_batch(p)]


@pytest.fixture(scope="module")
def setup():
    ctx = zmq.Context()
    sub = Subscriber(ctx)
    replay_port = free_port()
    # fp16 blocks of SmolLM2 take ~0.7 MiB each: a 12 MiB pool holds ~500 tokens, so the third
    # distinct long prompt evicts the first one's cached blocks.
    s = Server("--kv-cache", "fp16", "--parallel", "1", "--kv-budget", "12",
               "--kv-events", f"tcp://127.0.0.1:{sub.port}",
               "--kv-events-replay", f"tcp://127.0.0.1:{replay_port}", "--kv-events-topic", "kv")
    # A bound SUB sends its subscription only when its thread drives the socket: poll it while the
    # server's PUB connects, or the first batches go to nobody (the replay socket has them anyway).
    sub.pump(0.5)
    yield ctx, sub, s, replay_port
    assert s.stop() == 0, "".join(s.log)
    ctx.destroy(linger=0)


def complete(s, prompt, n=4):
    st, _, body = s.request("POST", "/v1/completions",
                            {"model": "m", "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True})
    assert st == 200, body


def prompt_of(seed, n):
    return [1 + (seed * 7919 + i * 104729) % 40000 for i in range(n)]


def test_blocks_stored_follow_the_prompt_and_chain(setup):
    _, sub, s, _ = setup
    a = prompt_of(1, 3 * B + 5)
    complete(s, a)
    sub.pump(0.5)
    stored = [e for e in sub.events() if e[0] == "BlockStored"]
    assert stored, "no BlockStored for a 101-token prompt"
    # Every stored token list is a run of whole blocks of what we sent (prompt + generated tokens),
    # and the chain's first block has no parent.
    first = stored[0]
    assert first[2] is None and first[3][:B] == a[:B]
    hashes = [h for e in stored for h in e[1]]
    toks = [t for e in stored for t in e[3]]
    assert toks[:3 * B] == a[:3 * B], "the first three blocks' tokens are the prompt's"
    assert len(set(hashes)) == len(hashes)
    for e in stored[1:]:
        assert e[2] in hashes, "a later block's parent is a block stored before it"

    # A second prompt sharing the first two blocks: only its new blocks are stored, hanging under
    # the shared second block.
    known = set(hashes)
    b = a[:2 * B] + prompt_of(2, B + 3)
    complete(s, b)
    sub.pump(0.5)
    new = [e for e in sub.events() if e[0] == "BlockStored" and not set(e[1]) & known]
    assert new, "the diverging block was not stored"
    assert new[0][3][:B] == b[2 * B:3 * B]
    block2 = hashes[1]  # the node of a's second block
    assert new[0][2] == block2, "the new branch's parent is the shared second block"


def test_eviction_reports_removed_blocks(setup):
    _, sub, s, _ = setup
    for seed in (3, 4, 5, 6):
        complete(s, prompt_of(seed, 7 * B + 1), n=2)
    sub.pump(0.5)
    ev = sub.events()
    stored = {h for e in ev if e[0] == "BlockStored" for h in e[1]}
    removed = [h for e in ev if e[0] == "BlockRemoved" for h in e[1]]
    assert removed, "a 12 MiB pool evicted nothing after four 225-token prompts"
    assert set(removed) <= stored, "only stored blocks are removed"
    assert len(set(removed)) == len(removed), "a block is removed once"


def test_sequence_numbers_and_replay(setup):
    ctx, sub, _, replay_port = setup
    seqs = [q for q, _ in sub.got]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "sequence numbers are consecutive"
    # A DEALER (a REQ socket takes only the first of the many replies): [empty, start] out,
    # [empty, seq, payload] back for each batch, then [empty, -1, empty].
    req = ctx.socket(zmq.DEALER)
    req.connect(f"tcp://127.0.0.1:{replay_port}")
    start = seqs[len(seqs) // 2]
    req.send_multipart([b"", start.to_bytes(8, "big")])
    replayed = []
    while True:
        assert req.poll(5000), "no replay answer"
        empty, seq_bytes, payload = req.recv_multipart()
        assert empty == b""
        if int.from_bytes(seq_bytes, "big", signed=True) == -1:
            assert payload == b""
            break
        replayed.append((int.from_bytes(seq_bytes, "big"), payload))
    i = seqs.index(start)
    assert replayed[:len(seqs) - i] == sub.got[i:], "replay gives the same batches, from the asked number on"
    # A malformed request (7 bytes) gets nothing; the socket keeps answering good ones.
    req.send_multipart([b"", b"\0" * 7])
    req.send_multipart([b"", (10 ** 9).to_bytes(8, "big")])
    assert req.poll(5000)
    empty, seq_bytes, payload = req.recv_multipart()
    assert int.from_bytes(seq_bytes, "big", signed=True) == -1 and payload == b"", "past the ring: the end at once"
    req.close(linger=0)
