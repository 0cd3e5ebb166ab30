"""Parity of the C++ forward pass with the independent NumPy reference (tests/reference).

For a few fixed prompts on SmolLM2-135M-Instruct (Q4_1), `veloxquant generate --temp 0
--dump-logits` writes the prompt ids, the 32 greedy tokens and the logits of every position it
computed; the NumPy model (weights dequantised by the `gguf` package, activations in float64,
exact softmax attention) recomputes the logits of the same ids. We check:
  - every logit row agrees (max-abs difference and cosine similarity printed per prompt),
  - the NumPy argmax at every generated position is the token C++ chose, i.e. NumPy's greedy
    decoding gives the same 32 tokens (teacher forcing on the C++ ids is equivalent as long as
    all argmaxes agree, and it needs one NumPy forward instead of 32).

Why the thresholds (measured values are printed by the test):
  The C++ products quantize each input row to int8 in blocks of 32 (step = block max / 127)
  and store K/V in fp16 (relative error <= 2^-11); weights are bit-identical on both sides.
  The int8 path is chaotic at the level of single roundings and its noise is heavy-tailed
  over rows: the NumPy model itself, with its product inputs rounded to int8, its keys to
  fp16 and a relative 1e-7 perturbation, differs from exact NumPy by max-abs 1.8-2.3, mean
  cosine 0.9984-0.9990 and worst rows down to 0.967 (the chat prompt's row 19, a flat
  distribution) -- the same as C++ vs NumPy (max-abs 1.3-3.2, mean cosine 0.9981-0.9996,
  worst row 0.966). No tighter agreement is possible on this model. Thresholds: mean cosine
  >= 0.997, every row >= 0.95, max-abs <= 5.0 (~7% of the logit range). A real bug is far
  outside: the swapped rope layout gives mean cosine 0.77 and max-abs 29. Subtle errors (a 1%
  wrong rope frequency moves the cosine by 1e-5) hide under this noise; the tiny float-weight
  models below, where no int8 path runs, check every architecture at 1e-4 instead.
"""
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.reference.numpy_forward import NumpyModel  # noqa: E402
from tests.reference.tiny_models import write_tiny  # noqa: E402

MODEL = Path(os.environ.get("VQ_SMOLLM2_GGUF",
                            Path.home() / ".cache/veloxquant/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
VQ_BIN = os.environ.get("VQ_BIN", str(ROOT / "build/release/tools/veloxquant/veloxquant"))
N_GEN = 32
COS_MEAN_MIN = 0.997
COS_ROW_MIN = 0.95
MAX_ABS = 5.0
TIE_MARGIN = 1.0

PROMPTS = [
    ("plain", ["-p", "The capital of France is"]),
    ("chat", ["--chat", "-p", "Give me three tips for staying healthy."]),
    ("long", ["-p", "In 1969, Neil Armstrong and Buzz Aldrin landed on the Moon aboard the lunar "
                    "module Eagle, while Michael Collins orbited above in Columbia. The mission"]),
]


def read_dump(path):
    data = Path(path).read_bytes()
    assert data[:8] == b"VQLOGIT1"
    n_ids, n_prompt, n_vocab, n_rows = struct.unpack_from("<4I", data, 8)
    off = 24
    ids = np.frombuffer(data, dtype="<i4", count=n_ids, offset=off)
    off += 4 * n_ids
    logits = np.frombuffer(data, dtype="<f4", count=n_rows * n_vocab, offset=off).reshape(n_rows, n_vocab)
    return ids.tolist(), n_prompt, logits


@pytest.fixture(scope="module")
def ref():
    if not MODEL.exists():
        pytest.fail(f"default model missing at {MODEL}: run scripts/setup.sh")
    return NumpyModel(str(MODEL))


@pytest.mark.parametrize("name,args", PROMPTS, ids=[p[0] for p in PROMPTS])
def test_logits_and_greedy_tokens_match_numpy(ref, tmp_path, name, args):
    dump = tmp_path / "logits.bin"
    cmd = [VQ_BIN, "generate", "-m", str(MODEL), *args, "-n", str(N_GEN), "--temp", "0", "--ignore-eos",
           "-t", "2", "-q", "--dump-logits", str(dump)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    ids, n_prompt, logits = read_dump(dump)
    assert len(ids) == n_prompt + N_GEN and logits.shape[0] == n_prompt + N_GEN - 1

    want = ref.forward(ids[:-1])  # [n_prompt + N_GEN - 1, n_vocab], float64
    diff = np.abs(logits - want)
    cos = np.sum(logits * want, axis=1) / (np.linalg.norm(logits, axis=1) * np.linalg.norm(want, axis=1))
    span = float(want.max() - want.min())
    print(f"\n[{name}] {n_prompt} prompt + {N_GEN} generated tokens: max-abs diff {diff.max():.4f} "
          f"(logit range {span:.1f}), mean-abs {diff.mean():.5f}, cosine min {cos.min():.6f} "
          f"mean {cos.mean():.6f}")
    assert cos.mean() >= COS_MEAN_MIN, f"mean cosine {cos.mean()}"
    assert cos.min() >= COS_ROW_MIN, f"row {int(cos.argmin())} cosine {cos.min()}"
    assert diff.max() <= MAX_ABS, f"row {int(diff.max(axis=1).argmax())} max-abs {diff.max()}"

    # Greedy tokens: at every step NumPy's argmax on the same context is C++'s token, or C++'s
    # token is a near-tie for NumPy (within TIE_MARGIN of NumPy's best). Exact equality of all
    # 32 tokens is not reachable with int8 activations: the perturbed NumPy model above flips
    # near-ties too (measured divergences had NumPy margins 0.03-0.22). TIE_MARGIN = 1.0 is
    # ~3 sigma of the difference of two logits' noise; a real bug picks tokens NumPy ranks
    # many logits lower.
    gen = ids[n_prompt:]
    rows = want[n_prompt - 1:n_prompt - 1 + N_GEN]
    ref_best = rows.argmax(axis=1)
    gaps = rows.max(axis=1) - rows[np.arange(N_GEN), gen]
    n_same = int(np.sum(ref_best == np.array(gen)))
    print(f"[{name}] greedy: {n_same}/{N_GEN} steps where NumPy's argmax is C++'s token; "
          f"largest gap to NumPy's best {gaps.max():.4f}")
    assert gaps.max() <= TIE_MARGIN, f"step {int(gaps.argmax())}: C++ token is {gaps.max()} below NumPy's best"


TINY = {
    "llama_gqa": {},
    "llama_hd256": dict(n_heads=2, n_kv=1, head_dim=256, key_length=True),
    "llama_tied": dict(tied=True),
    "llama3_scaling": dict(scaling="llama3"),
    "linear_scaling": dict(scaling="linear"),
    "rope_freqs": dict(rope_freqs=True),
    "qwen2_bias": dict(arch="qwen2", bias=True, n_kv=1),
    "qwen3_qk_norm": dict(arch="qwen3", qk_norm=True),
    # gemma3: the default pattern (layers 0-4 local, 5 global), window 8, head_dim 32 != 64/4;
    # and a per-layer bool pattern with its own local rope base and window 5.
    "gemma3_default": dict(arch="gemma3", n_layers=6, n_kv=1, head_dim=32, key_length=True, tied=True),
    "gemma3_bool_pattern": dict(arch="gemma3", n_layers=3, swa_pattern=[True, False, True], sliding_window=5,
                                rope_base_swa=500.0),
}


@pytest.mark.parametrize("variant", sorted(TINY))
def test_tiny_float_models_match_numpy(tmp_path, variant):
    """Float32 weights: the C++ products take float inputs (no int8), the fp32 cache is exact, so
    C++ and NumPy agree to float32 rounding (~1e-6 of the logit range; threshold 1e-4), and the
    greedy tokens are identical. Positions run past the llama3 original context (32) so every
    frequency band of the scaling is exercised, and past a prefill chunk of 16 (-b 16)."""
    path = tmp_path / f"{variant}.gguf"
    write_tiny(path, **TINY[variant])
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, 101, size=40).tolist()
    dump = tmp_path / "logits.bin"
    n_gen = 12
    cmd = [VQ_BIN, "generate", "-m", str(path), "--prompt-ids", ",".join(map(str, prompt)), "-n", str(n_gen),
           "--temp", "0", "--kv-cache", "fp32", "-b", "16", "-t", "2", "-q", "--dump-logits", str(dump)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    ids, n_prompt, logits = read_dump(dump)
    assert ids[:n_prompt] == prompt and len(ids) == n_prompt + n_gen
    want = NumpyModel(str(path)).forward(ids[:-1])
    rel = np.abs(logits - want).max() / np.abs(want).max()
    print(f"\n[{variant}] rel. max diff {rel:.2e}")
    assert rel < 1e-4
    assert ids[n_prompt:] == want[n_prompt - 1:].argmax(axis=1).tolist()
