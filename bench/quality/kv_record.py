"""Records a llama-family model's per-layer queries, keys and values (before and after RoPE) over
token ids, for offline study of KV-cache quantisation error (issue 18).

    python -m bench.quality.kv_record MODEL.gguf IDS.txt N OUT.npz [--layers 0,1,...]

IDS.txt: whitespace-separated token ids (tests/tools/vq_tokenize writes them). The forward is
tests/reference/numpy_forward.py's (weights dequantised by the gguf package), in float32 here for
speed. OUT.npz holds, per layer l: q{l} [n, Hq, D] and k{l} [n, Hkv, D] before RoPE (biases
added), v{l} [n, Hkv, D], plus pos, freqs and the config (neox, n_rot, head_dim).
"""
from __future__ import annotations

import argparse
import math
import sys

import numpy as np

from tests.reference.numpy_forward import NumpyModel


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("ids")
    ap.add_argument("n", type=int)
    ap.add_argument("out")
    a = ap.parse_args()
    m = NumpyModel(a.model)
    c = m.cfg
    assert not c.gemma, "gemma3: use a llama-family model"
    ids = np.array([int(t) for t in open(a.ids).read().split()][: a.n])
    n = len(ids)
    pos = np.arange(n)
    x = m.w("token_embd.weight")[ids].astype(np.float32)
    mask = np.triu(np.full((n, n), -np.inf, dtype=np.float32), k=1)
    group = c.n_heads // c.n_kv_heads
    rec = {}
    for l in range(c.n_layers):
        p = f"blk.{l}."
        h = (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + c.norm_eps) * m.w(p + "attn_norm.weight")).astype(np.float32)
        q, k, v = (h @ m.w(p + f"attn_{t}.weight").T for t in "qkv")
        for t, arr in (("q", q), ("k", k), ("v", v)):
            b = m.w(p + f"attn_{t}.bias")
            if b is not None:
                arr += b
        q = q.reshape(n, c.n_heads, c.head_dim)
        k = k.reshape(n, c.n_kv_heads, c.head_dim)
        v = v.reshape(n, c.n_kv_heads, c.head_dim)
        qn, kn = m.w(p + "attn_q_norm.weight"), m.w(p + "attn_k_norm.weight")
        if qn is not None:
            q = q / np.sqrt(np.mean(q * q, -1, keepdims=True) + c.norm_eps) * qn
        if kn is not None:
            k = k / np.sqrt(np.mean(k * k, -1, keepdims=True) + c.norm_eps) * kn
        rec[f"q{l}"], rec[f"k{l}"], rec[f"v{l}"] = q.astype(np.float16), k.astype(np.float16), v.astype(np.float16)
        qr = m.rope(q.astype(np.float64), pos).astype(np.float32)
        kr = m.rope(k.astype(np.float64), pos).astype(np.float32)
        att = np.empty((n, c.n_heads, c.head_dim), dtype=np.float32)
        for hq in range(c.n_heads):
            hk = hq // group
            s = (qr[:, hq, :] @ kr[:, hk, :].T) / math.sqrt(c.head_dim) + mask
            s = np.exp(s - s.max(axis=1, keepdims=True))
            s /= s.sum(axis=1, keepdims=True)
            att[:, hq, :] = s @ v[:, hk, :]
        x = x + att.reshape(n, -1) @ m.w(p + "attn_output.weight").T
        h = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + c.norm_eps) * m.w(p + "ffn_norm.weight")
        g = h @ m.w(p + "ffn_gate.weight").T
        u = h @ m.w(p + "ffn_up.weight").T
        x = x + ((g / (1.0 + np.exp(-g))) * u) @ m.w(p + "ffn_down.weight").T
        for name in ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_gate.weight",
                     "ffn_up.weight", "ffn_down.weight"):
            m._cache.pop(p + name, None)  # keep memory flat
        print(f"layer {l} done", file=sys.stderr, flush=True)
    np.savez(a.out, pos=pos, freqs=m.freqs, neox=c.neox, n_rot=c.n_rot, head_dim=c.head_dim,
             n_layers=c.n_layers, **rec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
