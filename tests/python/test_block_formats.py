"""The 32-element block formats against llama.cpp's reference quantizers, as gguf-py copies them
bit for bit (gguf.quants): our encoder (vq::quantize_row, i.e. codec/scalar_blocks, shared by the
weights and the KV caches) must write the same bytes, and our decoder must read them back to the
same floats. Through the tests/tools/vq_blocks binary."""
import os
import pathlib
import subprocess

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants

TYPES = {"q8_0": T.Q8_0, "q4_0": T.Q4_0, "q4_1": T.Q4_1, "q5_0": T.Q5_0, "q5_1": T.Q5_1}


def tool():
    build = os.environ.get("VQ_BUILD_DIR")
    if not build:
        pytest.skip("VQ_BUILD_DIR is not set (run through ctest, which sets it)")
    exe = pathlib.Path(build) / "tests/tools/vq_blocks"
    assert exe.exists(), f"{exe} is missing: build the vq_blocks target"
    return str(exe)


def values(seed):
    """Blocks of many kinds: normal at scales from 2^-20 to 2^10 (fp16 subnormal scales too),
    offsets (for the _1 formats), exact ties on the quantization grid, constant and zero blocks."""
    rng = np.random.default_rng(seed)
    blocks = []
    for e in range(-20, 11, 2):
        blocks.append(rng.standard_normal((8, 32)) * 2.0 ** e)
        blocks.append(rng.standard_normal((4, 32)) * 2.0 ** e + 3 * 2.0 ** e)
    ties = rng.integers(-100, 100, size=(16, 32)) + 0.5
    ties[:, 0] = 127.0  # q8_0 step 1: every other value is a tie
    blocks.append(ties)
    small = rng.integers(-8, 8, size=(16, 32)) + 0.5
    small[:, 0] = -8.0  # q4_0 step 1
    blocks.append(small)
    blocks.append(np.full((2, 32), -0.75))
    blocks.append(np.zeros((2, 32)))
    return np.concatenate(blocks).astype(np.float32)


@pytest.mark.parametrize("name", sorted(TYPES))
def test_encoder_and_decoder_match_llamacpp_reference(name, tmp_path):
    exe = tool()
    x = values(seed=len(name) + ord(name[1]))
    src, enc, dec = tmp_path / "x.f32", tmp_path / "x.bin", tmp_path / "y.f32"
    x.tofile(src)
    subprocess.run([exe, "encode", name, src, enc], check=True)
    ours = np.fromfile(enc, dtype=np.uint8)
    ref = quants.quantize(x, TYPES[name]).reshape(-1)
    assert ours.size == ref.size
    bad = np.flatnonzero(ours != ref)
    assert bad.size == 0, f"{name}: {bad.size} bytes differ from llama.cpp's reference, first at byte {bad[0]}"
    subprocess.run([exe, "decode", name, enc, dec], check=True)
    y = np.fromfile(dec, dtype=np.float32)
    y_ref = quants.dequantize(ref, TYPES[name]).reshape(-1).astype(np.float32)
    np.testing.assert_array_equal(y, y_ref)


# K-quant super-blocks (256 elements): byte offsets of their fp16 scale fields (d, and dmin if any).
K_TYPES = {"q2_K": (T.Q2_K, 84, (80, 82)), "q3_K": (T.Q3_K, 110, (108,)), "q4_K": (T.Q4_K, 144, (0, 2)),
           "q5_K": (T.Q5_K, 176, (0, 2)), "q6_K": (T.Q6_K, 210, (208,))}


@pytest.mark.parametrize("name", sorted(K_TYPES))
def test_kquant_decoder_matches_gguf_py(name, tmp_path):
    """Random K-quant blocks (every code, scale and mask bit random; finite fp16 scales) decoded
    by vq::dequantize_row and by gguf-py's independent NumPy decoder must agree: this pins the
    block layouts (quant_blocks.h) to the ones llama.cpp writes."""
    exe = tool()
    qtype, size, halves = K_TYPES[name]
    rng = np.random.default_rng(size)
    blocks = rng.integers(0, 256, size=(64, size), dtype=np.uint8)
    for off in halves:
        h = (rng.standard_normal(64) * 0.05).astype(np.float16)
        blocks[:, off:off + 2] = h.view(np.uint8).reshape(64, 2)
    src, dec = tmp_path / "x.bin", tmp_path / "y.f32"
    blocks.tofile(src)
    subprocess.run([exe, "decode", name, src, dec], check=True)
    y = np.fromfile(dec, dtype=np.float32)
    y_ref = quants.dequantize(blocks.reshape(-1), qtype).reshape(-1).astype(np.float32)
    assert y.size == y_ref.size == 64 * 256
    np.testing.assert_allclose(y, y_ref, rtol=1e-6, atol=1e-7)
