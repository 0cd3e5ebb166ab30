#!/usr/bin/env python3
"""Compare two `generate --dump-logits` files (CPU vs device) of the same prompt: where the greedy
tokens part, the largest logit difference over the rows both share, and the top-2 margins at the
parting row on each side (a margin smaller than the logit differences means the two are a tie
within the device/CPU numerics).
  compare_dumps.py CPU_DUMP DEVICE_DUMP"""
import struct
import sys

import numpy as np


def load(path):
    b = open(path, "rb").read()
    assert b[:8] == b"VQLOGIT1", path
    n_ids, n_prompt, V, n_rows = struct.unpack("<4I", b[8:24])
    ids = np.frombuffer(b[24:24 + 4 * n_ids], dtype=np.int32)
    L = np.frombuffer(b[24 + 4 * n_ids:], dtype=np.float32).reshape(n_rows, V)
    return ids, n_prompt, L


def top2(row):
    o = np.argsort(-row)[:2]
    return int(o[0]), int(o[1]), float(row[o[0]] - row[o[1]])


a_ids, n_prompt, A = load(sys.argv[1])
b_ids, n_prompt_b, B = load(sys.argv[2])
assert n_prompt == n_prompt_b and (a_ids[:n_prompt] == b_ids[:n_prompt]).all(), "different prompts"
n = min(len(a_ids), len(b_ids))
part = next((i for i in range(n_prompt, n) if a_ids[i] != b_ids[i]), None)
shared_rows = (part if part is not None else n) - 1  # rows computed from the same history
d = np.abs(A[:shared_rows] - B[:shared_rows])
cos = [float(A[r] @ B[r] / (np.linalg.norm(A[r]) * np.linalg.norm(B[r]))) for r in range(shared_rows)]
gen = (part if part is not None else n) - n_prompt
print(f"prompt {n_prompt} tokens; greedy tokens equal for {gen} generated tokens"
      + ("" if part is not None else f" (all {n - n_prompt})")
      + f"; over the {shared_rows} shared rows: max |dlogit| {d.max():.4f}, mean {d.mean():.5f}, min cosine {min(cos):.6f}")
if part is not None:
    r = part - 1
    ca, cb = top2(A[r]), top2(B[r])
    print(f"  parting row {r}: cpu picks {ca[0]} over {ca[1]} by {ca[2]:.4f}; device picks {cb[0]} over {cb[1]} by "
          f"{cb[2]:.4f}; |dlogit| of the two candidates: {abs(A[r][ca[0]] - B[r][ca[0]]):.4f}, "
          f"{abs(A[r][cb[0]] - B[r][cb[0]]):.4f}; row max |dlogit| {np.abs(A[r] - B[r]).max():.4f}")
