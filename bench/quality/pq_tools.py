"""Shared by the per-layer quality scripts (kv_error.py, kv_transform.py): RoPE on recorded
activations, the orthonormal Walsh-Hadamard matrix and a plain k-means (NumPy's global RNG, seeded
by the scripts)."""
import math

import numpy as np


def make_rope(freqs, n_rot, neox):
    """rope(x, pos): x [n, heads, D] turned by RoPE to positions pos [n] (pairs (i, i + n_rot/2) for
    NeoX, else (2i, 2i+1))."""
    def rope(x, pos):
        ang = pos[:, None] * freqs[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        out = x.copy(); h = n_rot // 2
        if neox:
            a, b = x[..., :h], x[..., h:n_rot]
            out[..., :h] = a * cos - b * sin; out[..., h:n_rot] = a * sin + b * cos
        else:
            a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
            out[..., 0:n_rot:2] = a * cos - b * sin; out[..., 1:n_rot:2] = a * sin + b * cos
        return out
    return rope


def hadamard(D):
    """The orthonormal D x D Walsh-Hadamard matrix (D a power of two)."""
    h = np.array([[1.]])
    while h.shape[0] < D: h = np.block([[h, h], [h, -h]])
    return h / math.sqrt(D)


def kmeans(x, k, iters):
    """Lloyd's k-means from k random points; returns the centroids [k, dim]."""
    x = x.astype(np.float32)
    c = x[np.random.choice(len(x), k, replace=len(x) < k)].copy()
    for _ in range(iters):
        d = (x * x).sum(1)[:, None] - 2 * x @ c.T + (c * c).sum(1)[None]
        a = d.argmin(1)
        cnt = np.bincount(a, minlength=k)
        sums = np.zeros_like(c)
        for dd in range(x.shape[1]): sums[:, dd] = np.bincount(a, weights=x[:, dd], minlength=k)
        nz = cnt > 0
        c[nz] = sums[nz] / cnt[nz, None]
    return c


def window_attn_err(q, k, v, kq, vq, pos, sink, window):
    """(mean relative squared error of the attention output, mean KL of the attention distribution)
    of every 4th query past 2 * window when keys kq / values vq (None: exact) replace k / v outside
    the cache's fp16 tokens (the first `sink` and the last `window`). q [n, G, D] post-RoPE; k, kq,
    v, vq [n, D]."""
    D = q.shape[-1]
    pos = pos - pos[0]
    rows = np.arange(2 * window, len(pos), 4)
    t = pos[rows][:, None]; j = pos[None, :]
    exact = (j < sink) | (t - j < window)
    causal = j <= t
    errs = []; kls = []
    for g in range(q.shape[1]):
        qq = q[rows, g]
        s = qq @ k.T / math.sqrt(D); sh = qq @ kq.T / math.sqrt(D)
        sh = np.where(exact, s, sh)
        s = np.where(causal, s, -np.inf); sh = np.where(causal, sh, -np.inf)
        p = np.exp(s - s.max(1, keepdims=True)); p /= p.sum(1, keepdims=True)
        ph = np.exp(sh - sh.max(1, keepdims=True)); ph /= ph.sum(1, keepdims=True)
        o = p @ v
        oh = (ph * exact) @ v + (ph * ~exact) @ (v if vq is None else vq)
        errs.append((((oh - o) ** 2).sum(1) / (o ** 2).sum(1)).mean())
        kls.append((p * (np.log(p + 1e-30) - np.log(ph + 1e-30))).sum(1).mean())
    return float(np.mean(errs)), float(np.mean(kls))
