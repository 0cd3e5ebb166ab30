"""Independent NumPy forward pass of llama-family GGUF models (llama, qwen2, qwen3, gemma3).

Reads and dequantises the GGUF through the `gguf` PyPI package (not through VeloxQuant's
reader), keeps the weights in float32 and computes activations in float64, with exact causal
softmax attention over fp64 keys/values. It is a reference: slow and obvious, never fast.

Conventions (checked by `python -m tests.reference.check_rope`, see that file):
  - "llama" GGUFs store attn_q/attn_k rows permuted by the converter so that rotary pairs are
    adjacent: dims (2i, 2i+1) rotate together ("normal" rope).
  - "qwen2"/"qwen3" keep the Hugging Face layout: dims (i, i + n_rot/2) rotate together (NeoX).
  - "gemma3" (written from the HF Gemma3 model description and the Gemma 3 report): NeoX rope;
    embeddings times sqrt(n_embd); layers (l + 1) % 6 != 0 (or the per-layer bools / period of
    gemma3.attention.sliding_window_pattern) attend to the last `sliding_window` positions only
    (query i sees keys j with i - j < W) and rotate with base 10000 (or rope.freq_base_swa), the
    others see everything with rope.freq_base; per-head q/k RMSNorm; the attention and MLP outputs
    are RMS-normalised before their residual adds; the MLP gate is GELU with the tanh
    approximation; scores scaled by 1/sqrt(head_dim) (query_pre_attn_scalar = head_dim). The
    GGUF converter stores Gemma's norm weights with the +1 already added, so they multiply as
    stored, as for llama.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from gguf import GGUFReader, GGUFValueType
from gguf.quants import dequantize

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "gemma3")


def _field(reader: GGUFReader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    t = f.types[0]
    if t == GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    if t == GGUFValueType.ARRAY:
        return [f.parts[i].tolist()[0] if f.types[1] != GGUFValueType.STRING
                else bytes(f.parts[i]).decode("utf-8") for i in f.data]
    return f.parts[f.data[0]].tolist()[0]


@dataclass
class Config:
    arch: str
    n_layers: int
    n_embd: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_ff: int
    n_vocab: int
    rope_theta: float
    n_rot: int
    norm_eps: float
    neox: bool
    rope_scaling: str = "none"
    rope_factor: float = 1.0
    llama3: dict = field(default_factory=dict)
    # gemma3 (defaults: llama-family behaviour)
    gemma: bool = False
    sliding_window: int = 0
    sliding: list = field(default_factory=list)  # [n_layers] bools
    rope_theta_swa: float = 10000.0


class NumpyModel:
    def __init__(self, path: str):
        r = GGUFReader(path)
        arch = _field(r, "general.architecture")
        if arch not in SUPPORTED_ARCHS:
            raise ValueError(f"unsupported architecture {arch!r}")
        a = arch
        n_embd = int(_field(r, f"{a}.embedding_length"))
        n_heads = int(_field(r, f"{a}.attention.head_count"))
        head_dim = int(_field(r, f"{a}.attention.key_length", n_embd // n_heads))
        self.tensors = {t.name: t for t in r.tensors}
        emb = self.tensors["token_embd.weight"]
        n_vocab = int(emb.shape[1])
        scaling = _field(r, f"{a}.rope.scaling.type", "none")
        self.cfg = Config(
            arch=arch,
            n_layers=int(_field(r, f"{a}.block_count")),
            n_embd=n_embd,
            n_heads=n_heads,
            n_kv_heads=int(_field(r, f"{a}.attention.head_count_kv", n_heads)),
            head_dim=head_dim,
            n_ff=int(_field(r, f"{a}.feed_forward_length")),
            n_vocab=n_vocab,
            rope_theta=float(_field(r, f"{a}.rope.freq_base", 10000.0)),
            n_rot=int(_field(r, f"{a}.rope.dimension_count", head_dim)),
            norm_eps=float(_field(r, f"{a}.attention.layer_norm_rms_epsilon", 1e-5)),
            neox=arch in ("qwen2", "qwen3", "gemma3"),
            rope_scaling=scaling,
            rope_factor=float(_field(r, f"{a}.rope.scaling.factor", 1.0)),
            llama3=dict(
                low=float(_field(r, f"{a}.rope.scaling.low_freq_factor", 1.0)),
                high=float(_field(r, f"{a}.rope.scaling.high_freq_factor", 4.0)),
                orig=float(_field(r, f"{a}.rope.scaling.original_context_length", 8192)),
            ),
        )
        c = self.cfg
        if arch == "gemma3":
            c.gemma = True
            c.sliding_window = int(_field(r, f"{a}.attention.sliding_window"))
            c.rope_theta_swa = float(_field(r, f"{a}.rope.freq_base_swa", 10000.0))
            pat = _field(r, f"{a}.attention.sliding_window_pattern", 6)
            if isinstance(pat, list):
                c.sliding = [bool(x) for x in pat]
            else:
                c.sliding = [(l + 1) % int(pat) != 0 for l in range(c.n_layers)]
        self._cache: dict[str, np.ndarray] = {}
        self.freqs = self._rope_freqs()
        self.freqs_swa = c.rope_theta_swa ** (-np.arange(0, c.n_rot, 2, dtype=np.float64) / c.n_rot)

    def w(self, name: str) -> np.ndarray | None:
        """Dequantised tensor in numpy order ([ne1, ne0] for matrices), float32."""
        if name in self._cache:
            return self._cache[name]
        t = self.tensors.get(name)
        if t is None:
            return None
        arr = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        arr = arr.reshape([int(d) for d in reversed(t.shape.tolist())]).squeeze()
        self._cache[name] = arr
        return arr

    def _rope_freqs(self) -> np.ndarray:
        c = self.cfg
        i = np.arange(0, c.n_rot, 2, dtype=np.float64)
        freqs = c.rope_theta ** (-i / c.n_rot)
        ff = self.w("rope_freqs.weight")
        if ff is not None:  # Llama 3.1 style: divisors stored as a tensor
            freqs = freqs / ff.astype(np.float64)
        elif c.rope_scaling == "linear":
            freqs = freqs / c.rope_factor
        elif c.rope_scaling == "llama3":
            lo, hi, orig = c.llama3["low"], c.llama3["high"], c.llama3["orig"]
            out = []
            for f in freqs:
                wavelen = 2 * math.pi / f
                if wavelen < orig / hi:
                    out.append(f)
                elif wavelen > orig / lo:
                    out.append(f / c.rope_factor)
                else:
                    s = (orig / wavelen - lo) / (hi - lo)
                    out.append((1 - s) * f / c.rope_factor + s * f)
            freqs = np.array(out)
        elif c.rope_scaling not in ("none", ""):
            raise ValueError(f"unsupported rope scaling {c.rope_scaling!r}")
        return freqs

    def rope(self, x: np.ndarray, pos: np.ndarray, neox: bool | None = None, freqs=None) -> np.ndarray:
        """x: [n, heads, head_dim]; rotates the first n_rot dims of each head."""
        c = self.cfg
        neox = c.neox if neox is None else neox
        freqs = self.freqs if freqs is None else freqs
        ang = pos[:, None].astype(np.float64) * freqs[None, :]  # [n, n_rot/2]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        out = x.copy()
        if neox:
            half = c.n_rot // 2
            a, b = x[..., :half], x[..., half:c.n_rot]
            out[..., :half] = a * cos - b * sin
            out[..., half:c.n_rot] = a * sin + b * cos
        else:
            a, b = x[..., 0:c.n_rot:2], x[..., 1:c.n_rot:2]
            out[..., 0:c.n_rot:2] = a * cos - b * sin
            out[..., 1:c.n_rot:2] = a * sin + b * cos
        return out

    def rmsnorm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.cfg.norm_eps) * w

    @staticmethod
    def int8_blocks(x: np.ndarray) -> np.ndarray:
        """x rounded as an int8-activation product sees it: blocks of 32 along the last axis,
        step amax/127, round to nearest (to model that error source; off by default)."""
        shape = x.shape
        b = x.reshape(-1, 32)
        amax = np.abs(b).max(axis=1, keepdims=True)
        step = np.where(amax > 0, amax / 127.0, 1.0)
        return (np.rint(b / step) * step).reshape(shape)

    def proj(self, h: np.ndarray, w: np.ndarray) -> np.ndarray:
        return (self.int8_blocks(h) if self.act_int8 else h) @ w.T

    def forward(self, tokens, neox: bool | None = None, act_int8: bool = False, rows=None) -> np.ndarray:
        """Logits [n, n_vocab] (float64) for every position of `tokens` from position 0, or only
        for the positions in `rows` ([len(rows), n_vocab]: a 262k vocabulary makes every row 2 MB).
        act_int8: round each product's input rows to int8 blocks first (diagnostics only)."""
        self.act_int8 = act_int8
        c = self.cfg
        tokens = np.asarray(tokens, dtype=np.int64)
        n = len(tokens)
        pos = np.arange(n)
        x = self.w("token_embd.weight")[tokens].astype(np.float64)  # [n, n_embd]
        if c.gemma:
            x = x * math.sqrt(c.n_embd)
        mask = np.triu(np.full((n, n), -np.inf), k=1)
        # sliding-window layers: query i also loses keys j <= i - W
        mask_swa = mask + np.tril(np.full((n, n), -np.inf), k=-c.sliding_window) if c.gemma else mask
        group = c.n_heads // c.n_kv_heads
        for l in range(c.n_layers):
            p = f"blk.{l}."
            local = c.gemma and c.sliding[l]
            freqs = self.freqs_swa if local else self.freqs
            h = self.rmsnorm(x, self.w(p + "attn_norm.weight"))
            q = self.proj(h, self.w(p + "attn_q.weight"))
            k = self.proj(h, self.w(p + "attn_k.weight"))
            v = self.proj(h, self.w(p + "attn_v.weight"))
            for name, t in (("attn_q.bias", "q"), ("attn_k.bias", "k"), ("attn_v.bias", "v")):
                b = self.w(p + name)
                if b is not None:
                    if t == "q": q = q + b
                    elif t == "k": k = k + b
                    else: v = v + b
            q = q.reshape(n, c.n_heads, c.head_dim)
            k = k.reshape(n, c.n_kv_heads, c.head_dim)
            v = v.reshape(n, c.n_kv_heads, c.head_dim)
            qn, kn = self.w(p + "attn_q_norm.weight"), self.w(p + "attn_k_norm.weight")
            if qn is not None:
                q = self.rmsnorm(q, qn)
            if kn is not None:
                k = self.rmsnorm(k, kn)
            q, k = self.rope(q, pos, neox, freqs), self.rope(k, pos, neox, freqs)
            att = np.empty((n, c.n_heads, c.head_dim))
            for hq in range(c.n_heads):
                hk = hq // group
                s = (q[:, hq, :] @ k[:, hk, :].T) / math.sqrt(c.head_dim) + (mask_swa if local else mask)
                s = np.exp(s - s.max(axis=1, keepdims=True))
                s /= s.sum(axis=1, keepdims=True)
                att[:, hq, :] = s @ v[:, hk, :]
            o = self.proj(att.reshape(n, -1), self.w(p + "attn_output.weight"))
            if c.gemma:
                o = self.rmsnorm(o, self.w(p + "post_attention_norm.weight"))
            x = x + o
            h = self.rmsnorm(x, self.w(p + "ffn_norm.weight"))
            g = self.proj(h, self.w(p + "ffn_gate.weight"))
            u = self.proj(h, self.w(p + "ffn_up.weight"))
            if c.gemma:  # GELU, tanh approximation
                act = 0.5 * g * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g ** 3)))
            else:
                act = g / (1.0 + np.exp(-g))
            o = self.proj(act * u, self.w(p + "ffn_down.weight"))
            if c.gemma:
                o = self.rmsnorm(o, self.w(p + "post_ffw_norm.weight"))
            x = x + o
        if rows is not None:
            x = x[np.asarray(rows)]
        x = self.rmsnorm(x, self.w("output_norm.weight"))
        out = self.w("output.weight")
        if out is None:
            out = self.w("token_embd.weight")  # tied embeddings
        return self.proj(x, out)

    def greedy(self, prompt, n_new: int) -> list[int]:
        """Greedy continuation (recomputes the prefix each step; for short checks only)."""
        ids = list(prompt)
        for _ in range(n_new):
            ids.append(int(np.argmax(self.forward(ids)[-1])))
        return ids[len(prompt):]
