"""`--tp N` of `veloxquant generate` and `veloxquant perplexity` (issue 25: tensor parallelism, ranks
simulated on the CPU) on tiny random models: greedy tokens and every logit at tp 2 (and at tp 4,
which replicates the KV heads) equal tp 1's within float rounding, a qwen2 model with q/k/v biases
included; perplexity at tp 2 equals tp 1's; bad --tp values and unsupported combinations give one
clear line; a session saved at tp 2 continues exactly at tp 2 and is refused at tp 1 and tp 4 (a tp 1
session at tp 2) with one line naming the --tp to use; a damaged split file is refused."""
import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_cli_bad_input import ROOT, VQ_BIN, assert_one_clear_line, run_cli  # noqa: E402

sys.path.insert(0, str(ROOT))
from tests.reference.tiny_models import write_tiny  # noqa: E402

IDS = "1,7,3,9,22,41,5,60,2,11"


def read_dump(path):
    b = Path(path).read_bytes()
    assert b[:8] == b"VQLOGIT1"
    n_ids, n_prompt, n_vocab, n_rows = struct.unpack_from("<4I", b, 8)
    off = 24 + 4 * n_ids
    ids = np.frombuffer(b, dtype="<i4", count=n_ids, offset=24)
    return ids, np.frombuffer(b, dtype="<f4", count=n_rows * n_vocab, offset=off).reshape(n_rows, n_vocab)


def generate(tmp_path, model, tp):
    dump, stats = tmp_path / f"logits_{tp}.bin", tmp_path / f"stats_{tp}.json"
    rc, _, err = run_cli("generate", "-m", model, "--prompt-ids", IDS, "-n", "16", "--temp", "0", "-q", "-t", "2",
                         "--tp", tp, "--dump-logits", dump, "--stats-json", stats)
    assert rc == 0, err
    st = json.loads(stats.read_text())
    assert st["tp"] == tp
    ids, logits = read_dump(dump)
    return st["tokens"], ids, logits


def test_generate_tp_equals_tp1(tmp_path):
    for name, kw, tps in (("llama", {}, (2, 4)), ("qwen2", {"arch": "qwen2", "bias": True, "n_kv": 1}, (2, 4))):
        p = tmp_path / f"{name}.gguf"
        write_tiny(p, seed=3, **kw)
        tokens1, ids1, logits1 = generate(tmp_path, p, 1)
        assert len(set(tokens1)) > 1
        for tp in tps:
            tokens, ids, logits = generate(tmp_path, p, tp)
            assert tokens == tokens1, (name, tp)
            assert (ids == ids1).all()
            # f32 weights: only the order of the sums differs (the ranks' partial products added
            # in rank order)
            scale = np.abs(logits1).max()
            assert np.abs(logits - logits1).max() <= 1e-5 * scale, (name, tp, np.abs(logits - logits1).max())


def test_perplexity_tp_equals_tp1(tmp_path):
    p = tmp_path / "vocab.gguf"
    write_tiny(p, n_vocab=300, vocab=True, seed=5)
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 6)
    out = {}
    for tp in (1, 2):
        r = subprocess.run([VQ_BIN, "perplexity", "-m", str(p), "--text", str(text), "-c", "64", "--chunk", "16",
                            "--json", "-t", "2", "--tp", str(tp)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        out[tp] = json.loads(r.stdout)
        assert out[tp]["tp"] == tp
    assert out[1]["tokens_scored"] == out[2]["tokens_scored"] > 10
    assert abs(out[2]["perplexity"] - out[1]["perplexity"]) <= 1e-5 * out[1]["perplexity"]


def test_bad_tp_values(tmp_path):
    p = tmp_path / "ok.gguf"
    write_tiny(p)  # 4 query heads, 2 KV heads, n_ff 96
    gen = ("generate", "-m", p, "--prompt-ids", "1,2,3", "-n", "2", "-q")
    assert_one_clear_line(*run_cli(*gen, "--tp", "0")[::2], "--tp: 0 must be in 1..1024")
    assert_one_clear_line(*run_cli(*gen, "--tp", "-1")[::2], "--tp: -1")
    assert_one_clear_line(*run_cli(*gen, "--tp", "3")[::2], "4 attention heads do not split evenly over 3")
    assert_one_clear_line(*run_cli(*gen, "--tp", "8")[::2], "4 attention heads do not split evenly over 8")
    assert_one_clear_line(*run_cli(*gen, "--tp", "2", "--deterministic")[::2], "--tp 2", "--deterministic")
    # The device split runs where a GPU is (tests/model/test_tensor_parallel_device.cpp); this tiny
    # model's head_dim 16 is not a device shape, so both cases end in one line naming cuda.
    assert_one_clear_line(*run_cli(*gen, "--tp", "2", "--device", "cuda")[::2], "cuda")
    text = tmp_path / "t.txt"
    text.write_text("hello")
    ppl = ("perplexity", "-m", p, "--text", text)
    assert_one_clear_line(*run_cli(*ppl, "--tp", "0")[::2], "--tp: 0")
    assert_one_clear_line(*run_cli(*ppl, "--tp", "2", "--device", "cuda")[::2], "cuda")


def test_session_files_across_ranks(tmp_path):
    p = tmp_path / "q.gguf"
    write_tiny(p, seed=5, arch="qwen2", bias=True, n_kv=2)  # 4 query / 2 KV heads: tp 2 and 4 split them

    def gen(name, *args):
        out = tmp_path / f"{name}.json"
        rc, _, err = run_cli("generate", "-m", p, "--kv-cache", "fp16", "--temp", "0", "-q", "-t", "2",
                             "--ignore-eos", "--stats-json", out, *args)
        return rc, err, (json.loads(out.read_text()) if rc == 0 else None)

    rc, err, whole = gen("whole", "--prompt-ids", IDS, "-n", "20", "--tp", "2")
    assert rc == 0, err
    sess = tmp_path / "s2.vqkv"
    rc, err, first = gen("first", "--prompt-ids", IDS, "-n", "8", "--tp", "2", "--save-session", sess)
    assert rc == 0, err
    assert sess.read_bytes()[:8] == b"VQKVTPS\0"
    rc, err, rest = gen("rest", "--load-session", sess, "-n", "12", "--tp", "2")
    assert rc == 0, err
    assert first["tokens"] + rest["tokens"] == whole["tokens"]
    assert rest["n_prompt"] == len(IDS.split(",")) + 8
    # another rank count, or a plain file at tp 2: one line naming the --tp to use
    assert_one_clear_line(*run_cli("generate", "-m", p, "--kv-cache", "fp16", "--load-session", sess, "-n", "2",
                                   "-q")[::2], "split over 2 tensor-parallel ranks", "--tp 2")
    assert_one_clear_line(*run_cli("generate", "-m", p, "--kv-cache", "fp16", "--load-session", sess, "-n", "2",
                                   "-q", "--tp", "4")[::2], "split over 2", "this session has 4")
    plain = tmp_path / "s1.vqkv"
    rc, err, _ = gen("plain", "--prompt-ids", IDS, "-n", "2", "--save-session", plain)
    assert rc == 0, err
    assert_one_clear_line(*run_cli("generate", "-m", p, "--kv-cache", "fp16", "--load-session", plain, "-n", "2",
                                   "-q", "--tp", "2")[::2], "saved unsplit (tp 1)")
    # a flipped byte in rank 1's part, a truncated file
    data = bytearray(sess.read_bytes())
    data[len(data) - 100] ^= 1
    bad = tmp_path / "bad.vqkv"
    bad.write_bytes(bytes(data))
    assert_one_clear_line(*run_cli("generate", "-m", p, "--kv-cache", "fp16", "--load-session", bad, "-n", "2",
                                   "-q", "--tp", "2")[::2], str(bad))
    bad.write_bytes(bytes(sess.read_bytes()[:-7]))
    assert_one_clear_line(*run_cli("generate", "-m", p, "--kv-cache", "fp16", "--load-session", bad, "-n", "2",
                                   "-q", "--tp", "2")[::2], "truncated")


def test_parallel_generate_at_tp2(tmp_path):
    """One prompt, 3 sequences through the engine split over 2 ranks (--parallel: the prompt prefilled
    once, forks): every sequence runs to its length (token equality with tp 1:
    tests/engine/test_engine_tp.cpp)."""
    p = tmp_path / "m.gguf"
    write_tiny(p, seed=9, arch="qwen2", bias=True, n_kv=2)
    rc, out, err = run_cli("generate", "-m", p, "--prompt-ids", IDS, "-n", "6", "--temp", "0", "--parallel", "3",
                           "-t", "2", "--tp", "2", "--ignore-eos")
    assert rc == 0, err
    assert out.count("6 generated, length") == 3, out
