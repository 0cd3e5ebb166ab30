"""Parity of the C++ forward pass with the independent NumPy reference (tests/reference).

For a few fixed prompts on SmolLM2-135M-Instruct (Q4_1) and Gemma 3 270M (Q4_K_M; its own
thresholds and measurements are above GEMMA_PROMPTS), `veloxquant generate --temp 0
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
  >= 0.997, every row >= 0.93, max-abs <= 5.0 (~7% of the logit range). A real bug is far
  outside: the swapped rope layout gives mean cosine 0.77 and max-abs 29. Subtle errors (a 1%
  wrong rope frequency moves the cosine by 1e-5) hide under this noise; the tiny float-weight
  models below, where no int8 path runs, check every architecture at 1e-4 instead.
"""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.reference.numpy_forward import NumpyModel  # noqa: E402
from tests.reference.real_models import (GEMMA3, SMOLLM2, VQ_BIN, agreement, generate_greedy,  # noqa: E402
                                         greedy_gaps, long_text, read_dump)
from tests.reference.tiny_models import write_tiny  # noqa: E402

MODEL = SMOLLM2
N_GEN = 32
COS_MEAN_MIN = 0.997
# The worst row (the chat prompt's row 19, a flat distribution) moves with any change of float
# order in the products: 2026-12-03, fp16 KV, C++ at 461ea00 0.958, with the packed q4_1/q8_0
# products of issue 22 (same integer sums, another float order) 0.948; fp32 KV 0.992 / 0.976;
# the int8-rounded NumPy with a 1e-6 relative perturbation 0.977-0.992 over 4 seeds (no fp16
# K/V); on the long prompt the same change moved the worst row the other way (0.982 -> 0.997).
# Hence 0.93, not 0.95.
COS_ROW_MIN = 0.93
MAX_ABS = 5.0
TIE_MARGIN = 1.0

PROMPTS = [
    ("plain", ["-p", "The capital of France is"]),
    ("chat", ["--chat", "-p", "Give me three tips for staying healthy."]),
    ("long", ["-p", "In 1969, Neil Armstrong and Buzz Aldrin landed on the Moon aboard the lunar "
                    "module Eagle, while Michael Collins orbited above in Columbia. The mission"]),
]


def check_against_numpy(ref, model, tmp_path, name, args, cos_mean_min, cos_row_min, max_abs, tie_margin,
                        every=1):
    """Runs C++ greedy generation with its logits dumped and the NumPy forward on the same ids;
    compares every `every`-th prompt row and every generated row."""
    ids, n_prompt, logits = generate_greedy(model, args, N_GEN, tmp_path / "logits.bin")
    rows = sorted(set(range(0, n_prompt - 1, every)) | set(range(n_prompt - 1, len(ids) - 1)))
    want = ref.forward(ids[:-1], rows=rows)  # [len(rows), n_vocab], float64
    a = agreement(logits[rows], want)
    print(f"\n[{name}] {n_prompt} prompt + {N_GEN} generated tokens, {len(rows)} rows: {a}")
    assert a.cos_mean >= cos_mean_min, f"mean cosine {a.cos_mean}"
    assert a.cos_min >= cos_row_min, f"row {rows[a.worst_row]} cosine {a.cos_min}"
    assert a.max_abs <= max_abs, f"max-abs {a.max_abs}"
    # Greedy tokens: at every step NumPy's argmax on the same context is C++'s token, or C++'s
    # token is a near-tie for NumPy (within tie_margin of NumPy's best).
    n_same, gap = greedy_gaps(want[-N_GEN:], ids[n_prompt:])
    print(f"[{name}] greedy: {n_same}/{N_GEN} steps where NumPy's argmax is C++'s token; "
          f"largest gap to NumPy's best {gap:.4f}")
    assert gap <= tie_margin, f"a C++ token is {gap} below NumPy's best"


@pytest.fixture(scope="module")
def ref():
    if not MODEL.exists():
        pytest.fail(f"default model missing at {MODEL}: run scripts/setup.sh")
    return NumpyModel(str(MODEL))


@pytest.mark.parametrize("name,args", PROMPTS, ids=[p[0] for p in PROMPTS])
def test_logits_and_greedy_tokens_match_numpy(ref, tmp_path, name, args):
    # Exact equality of all 32 greedy tokens is not reachable with int8 activations: the
    # perturbed NumPy model above flips near-ties too (measured divergences had NumPy margins
    # 0.03-0.22). TIE_MARGIN = 1.0 is ~3 sigma of the difference of two logits' noise; a real bug
    # picks tokens NumPy ranks many logits lower.
    check_against_numpy(ref, MODEL, tmp_path, name, args, COS_MEAN_MIN, COS_ROW_MIN, MAX_ABS, TIE_MARGIN)


# Gemma 3 270M (Q4_K_M; 15 of its 18 layers see a 512-token window). Measured (C++ vs exact
# NumPy; and, for the noise floor, NumPy with its product inputs rounded to int8 blocks as the
# C++ products see them vs exact NumPy), every 25th prompt row and all generated rows:
#   plain  C++: cos mean 0.999725 min 0.998810 max-abs 0.75 | int8 NumPy: 0.999763 0.999075 0.72
#   chat   C++: cos mean 0.999757 min 0.998822 max-abs 1.62 | int8 NumPy: 0.999779 0.998945 1.77
#   long   C++: cos mean 0.999771 min 0.998903 max-abs 1.26 | int8 NumPy: 0.999761 0.998283 1.47
#   (long: 775 prompt tokens; greedy largest gap 0.073, 30/32 NumPy argmaxes equal)
# so C++ sits at the noise floor of int8 activations. Thresholds about 4x that noise away
# from 1 (mean >= 0.999, rows >= 0.995, max-abs <= 4 of a logit range of 50-130, tie margin
# 0.5). Real bugs are far outside: with the long prompt, ignoring the window gives cos mean
# 0.733 (rows past 512: 0.600), the global rope base on local layers 0.610. Off-by-one windows
# move the logits by less than the noise; the tiny models below check the window exactly.
GEMMA_PROMPTS = [
    ("plain", ["-p", "The capital of France is"]),
    ("chat", ["--chat", "-p", "Give me three tips for staying healthy."]),
    ("long", None),  # long_text(): crosses the sliding window
]


@pytest.fixture(scope="module")
def gemma_ref():
    if not GEMMA3.exists():
        pytest.fail(f"Gemma 3 model missing at {GEMMA3}: run scripts/setup.sh")
    return NumpyModel(str(GEMMA3))


@pytest.mark.parametrize("name,args", GEMMA_PROMPTS, ids=[p[0] for p in GEMMA_PROMPTS])
def test_gemma3_logits_and_greedy_tokens_match_numpy(gemma_ref, tmp_path, name, args):
    args = args or ["-p", long_text()]
    check_against_numpy(gemma_ref, GEMMA3, tmp_path, f"gemma3 {name}", args, 0.999, 0.995, 4.0, 0.5, every=25)


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
