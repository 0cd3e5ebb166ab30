"""Bad input to the CLI: a missing file, a non-GGUF file, the real model truncated at many
offsets, an unsupported architecture or weight type, a bad KV-cache spec. Every case must end
with a non-zero exit code (not a signal) and exactly one line on stderr that says what is wrong.
"""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.reference.tiny_models import write_tiny  # noqa: E402

MODEL = Path(os.environ.get("VQ_SMOLLM2_GGUF",
                            Path.home() / ".cache/veloxquant/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
VQ_BIN = os.environ.get("VQ_BIN", str(ROOT / "build/release/tools/veloxquant/veloxquant"))


def run_cli(*args):
    r = subprocess.run([VQ_BIN, *map(str, args)], capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout, r.stderr


def assert_one_clear_line(rc, err, *needles):
    assert rc == 1, f"exit code {rc} (a negative code is a signal: a crash); stderr: {err!r}"
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}: {err!r}"
    assert lines[0].startswith("veloxquant: error: "), lines[0]
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"


def both_commands(path):
    """The error of `info` and of `generate` (which also builds a session) on one file."""
    yield run_cli("info", path)
    yield run_cli("generate", "-m", path, "-p", "hello", "-n", "2", "-q")


def test_missing_file(tmp_path):
    p = tmp_path / "nope.gguf"
    for rc, _, err in both_commands(p):
        assert_one_clear_line(rc, err, str(p))


def test_not_a_gguf_file(tmp_path):
    p = tmp_path / "text.gguf"
    p.write_text("this is not a model\n" * 10)
    for rc, _, err in both_commands(p):
        assert_one_clear_line(rc, err, str(p))
    e = tmp_path / "empty.gguf"
    e.write_bytes(b"")
    for rc, _, err in both_commands(e):
        assert_one_clear_line(rc, err)


def test_truncated_model_at_many_offsets(tmp_path):
    if not MODEL.exists():
        pytest.fail(f"default model missing at {MODEL}: run scripts/setup.sh")
    data = MODEL.read_bytes()
    n = len(data)
    # Inside the magic/version/counts, the metadata (strings, the vocabulary arrays), the tensor
    # infos, the alignment padding and the tensor data, and one byte short of the end.
    offsets = [1, 4, 7, 12, 20, 23, 24, 40, 100, 1000, 10_000, 100_000, 500_000, 1_000_000, 1_500_000,
               2_000_000, n // 4, n // 2, n - 4096, n - 1]
    rng = np.random.default_rng(0)
    offsets += sorted(int(x) for x in rng.integers(1, 2_200_000, size=8))
    p = tmp_path / "trunc.gguf"
    for off in offsets:
        p.write_bytes(data[:off])
        rc, _, err = run_cli("info", p)
        assert_one_clear_line(rc, err, str(p))
    # The generate path on a few of them (it maps the same file; quick checks).
    for off in (24, 1_000_000, n - 1):
        p.write_bytes(data[:off])
        rc, _, err = run_cli("generate", "-m", p, "-p", "hi", "-n", "1", "-q")
        assert_one_clear_line(rc, err, str(p))


def test_unsupported_architecture(tmp_path):
    p = tmp_path / "gpt2.gguf"
    write_tiny(p, arch="gpt2")
    for rc, _, err in both_commands(p):
        assert_one_clear_line(rc, err, "unsupported architecture 'gpt2'")


def test_unsupported_weight_type(tmp_path):
    import gguf
    p = tmp_path / "iq4xs.gguf"
    # attn_q as IQ4_XS (136 bytes per 256 elements), a type this build does not multiply.
    raw = np.random.default_rng(0).integers(0, 256, size=(256, 136), dtype=np.uint8)
    write_tiny(p, n_embd=256, n_heads=4, n_kv=2, head_dim=64,
               replace={"blk.0.attn_q.weight": (raw, gguf.GGMLQuantizationType.IQ4_XS)})
    for rc, _, err in both_commands(p):
        assert_one_clear_line(rc, err, "blk.0.attn_q.weight", "iq4_xs")


def test_bad_kv_cache_spec_and_numbers(tmp_path):
    p = tmp_path / "ok.gguf"
    write_tiny(p)
    rc, _, err = run_cli("generate", "-m", p, "--prompt-ids", "1,2,3", "-n", "2", "--kv-cache", "fp12")
    assert_one_clear_line(rc, err, "fp12")
    rc, _, err = run_cli("generate", "-m", p, "--prompt-ids", "1,2,500", "-n", "2")
    assert_one_clear_line(rc, err, "500")
    rc, _, err = run_cli("generate", "-m", p, "--prompt-ids", "1,2,3", "-n", "2", "-c", "3")
    assert_one_clear_line(rc, err, "context")
    # And the same tiny model runs fine.
    rc, _, err = run_cli("generate", "-m", p, "--prompt-ids", "1,2,3", "-n", "2", "-q")
    assert rc == 0, err


def test_bad_prefill_step_and_itl_flags(tmp_path):
    """generate -b (0 = the device's default step) and bench e2e's --itl / --itl-chunks: one clear line each."""
    p = tmp_path / "ok.gguf"
    write_tiny(p)
    rc, _, err = run_cli("generate", "-m", p, "--prompt-ids", "1,2,3", "-n", "2", "-b", "-1")
    assert_one_clear_line(rc, err, "-b: -1")
    rc, _, err = run_cli("bench", "e2e", "--itl", "5")
    assert_one_clear_line(rc, err, "--itl is for --device cuda")
    rc, _, err = run_cli("bench", "e2e", "--device", "cuda", "--geometry", "qwen2.5-1.5b", "--itl", "-3")
    assert_one_clear_line(rc, err, "--itl: -3")
    rc, _, err = run_cli("bench", "e2e", "--device", "cuda", "--geometry", "qwen2.5-1.5b", "--itl-chunks", "0,x")
    assert_one_clear_line(rc, err, "--itl-chunks: '0'")
    rc, _, err = run_cli("bench", "e2e", "--deterministic")
    assert_one_clear_line(rc, err, "--deterministic is for --device cuda")
    rc, _, err = run_cli("bench", "e2e", "--key-mean", "rotated")
    assert_one_clear_line(rc, err, "--key-mean is for --device cuda")
    rc, _, err = run_cli("bench", "e2e", "--device", "cuda", "--geometry", "qwen2.5-1.5b", "--key-mean", "sideways")
    assert rc != 0 and "--key-mean" in err and "sideways" in err, err
    rc, _, err = run_cli("bench", "e2e", "--key-transform", "learned")
    assert_one_clear_line(rc, err, "--key-transform is for --device cuda")
    rc, _, err = run_cli("bench", "e2e", "--device", "cuda", "--geometry", "qwen2.5-1.5b", "--key-transform", "rotated")
    assert rc != 0 and "--key-transform" in err and "rotated" in err, err
    rc, _, err = run_cli("generate", "-m", p, "--prompt-ids", "1,2,3", "-n", "2", "--deterministic",
                         "--dump-logits", tmp_path / "l.bin")
    assert_one_clear_line(rc, err, "--deterministic")
    assert not (tmp_path / "l.bin").exists()
    # -b 0 picks the default step and runs
    rc, _, err = run_cli("generate", "-m", p, "--prompt-ids", "1,2,3", "-n", "2", "-q", "-b", "0")
    assert rc == 0, err
