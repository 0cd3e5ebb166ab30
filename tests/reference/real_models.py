"""Shared by the parity tests on the real models: where the models are, the prompts, running
`veloxquant generate --dump-logits`, and the agreement statistics of two sets of logit rows."""
from __future__ import annotations

import gzip
import os
import re
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
# <cache>/models as src/core/cache_dir.cpp and scripts/setup.sh define it
_CACHE = os.environ.get("VQ_CACHE_DIR") or (Path(os.environ["XDG_CACHE_HOME"]) / "veloxquant" if os.environ.get(
    "XDG_CACHE_HOME") else Path.home() / ".cache/veloxquant")
_MODELS = Path(_CACHE) / "models"
SMOLLM2 = Path(os.environ.get("VQ_SMOLLM2_GGUF", _MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"))
GEMMA3 = Path(os.environ.get("VQ_GEMMA3_GGUF", _MODELS / "gemma-3-270m-q4_k_m.gguf"))
VQ_BIN = os.environ.get("VQ_BIN", str(ROOT / "build/release/tools/veloxquant/veloxquant"))
JARGON = Path("/usr/share/doc/jargon-text/jargon.txt.gz")  # Debian jargon-text (scripts/setup.sh)


def long_text() -> str:
    """~3.5k characters of English prose (the Jargon File's introduction, whitespace folded): 775
    Gemma 3 tokens, past its 512-token sliding window."""
    lines = gzip.open(JARGON, "rt", encoding="utf-8").read().splitlines()
    return re.sub(r"\s+", " ", " ".join(lines[280:345])).strip()


def read_dump(path):
    """`generate --dump-logits` file: (ids, n_prompt, logits [n_rows, n_vocab] f32)."""
    data = Path(path).read_bytes()
    assert data[:8] == b"VQLOGIT1"
    n_ids, n_prompt, n_vocab, n_rows = struct.unpack_from("<4I", data, 8)
    off = 24
    ids = np.frombuffer(data, dtype="<i4", count=n_ids, offset=off)
    off += 4 * n_ids
    logits = np.frombuffer(data, dtype="<f4", count=n_rows * n_vocab, offset=off).reshape(n_rows, n_vocab)
    return ids.tolist(), n_prompt, logits


def generate_greedy(model, args, n_gen, dump, extra=()):
    """Greedy generation of n_gen tokens (end-of-generation ignored) with every logit row dumped."""
    cmd = [VQ_BIN, "generate", "-m", str(model), *args, "-n", str(n_gen), "--temp", "0", "--ignore-eos",
           "-t", "2", "-q", "--dump-logits", str(dump), *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    ids, n_prompt, logits = read_dump(dump)
    assert len(ids) == n_prompt + n_gen and logits.shape[0] == n_prompt + n_gen - 1
    return ids, n_prompt, logits


@dataclass
class Agreement:
    max_abs: float    # largest |ours - ref| over all compared logits
    span: float       # logit range of the reference
    cos_mean: float
    cos_min: float
    worst_row: int    # index (into the compared rows) of cos_min

    def __str__(self):
        return (f"max-abs diff {self.max_abs:.4f} (logit range {self.span:.1f}), cosine mean {self.cos_mean:.6f} "
                f"min {self.cos_min:.6f} (row {self.worst_row})")


def agreement(ours: np.ndarray, ref: np.ndarray) -> Agreement:
    ours, ref = np.asarray(ours, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    cos = np.sum(ours * ref, axis=1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(ref, axis=1))
    return Agreement(float(np.abs(ours - ref).max()), float(ref.max() - ref.min()), float(cos.mean()),
                     float(cos.min()), int(cos.argmin()))


def greedy_gaps(ref_rows: np.ndarray, chosen) -> tuple[int, float]:
    """For the rows the chosen tokens were picked from: how many times the reference's argmax is
    the chosen token, and the largest shortfall of a chosen token below the reference's best."""
    chosen = np.asarray(chosen)
    best = ref_rows.argmax(axis=1)
    gaps = ref_rows.max(axis=1) - ref_rows[np.arange(len(chosen)), chosen]
    return int(np.sum(best == chosen)), float(gaps.max())


def blame(ours: np.ndarray, theirs: np.ndarray, exact: np.ndarray, ours_name: str = "C++",
          theirs_name: str = "llama.cpp", factor: float = 4.0, tol: float = 3e-3) -> str:
    """Which side of a failed comparison is the wrong one, judged by an exact reference's logits
    of the same rows: each side's distance to it is 1 - mean cosine; a side past `tol` (the parity
    tests' 1 - 0.997: int8-rounded products sit at 0.4-1.9e-3 from exact) and `factor` times
    farther than the other is named. Returns one sentence with both agreements."""
    a, b = agreement(ours, exact), agreement(theirs, exact)
    da, db = 1.0 - a.cos_mean, 1.0 - b.cos_mean
    both = f"{ours_name} vs exact: {a}; {theirs_name} vs exact: {b}"
    if db > tol and db >= factor * max(da, 1e-9):
        return f"{theirs_name} is the side far from the exact reference ({both})"
    if da > tol and da >= factor * max(db, 1e-9):
        return f"{ours_name} is the side far from the exact reference ({both})"
    if da > tol and db > tol:
        return f"both sides are far from the exact reference ({both})"
    return f"neither side is far from the exact reference: the gap is their own rounding ({both})"
