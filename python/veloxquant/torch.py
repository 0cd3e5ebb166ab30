"""veloxquant.torch: the VeloxQuant KV cache inside Hugging Face transformers (5.x) and PyTorch.

The two-line change::

    import veloxquant.torch as vqt
    cache = vqt.cache(model, "vecinfer:d4b8", calib="model.vqcal")      # or "fp16"
    out = model.generate(**inputs, past_key_values=cache, max_new_tokens=64)

``cache()`` returns a transformers ``Cache`` whose layers keep keys and values in VeloxQuant's
KV pool as codes (on the GPU when the model is there, else the CPU store), and switches the
model's attention to ``"veloxquant"``, an ``AttentionInterface`` function that runs the
project's kernels on the codes (prefill and decode, batch > 1, GQA, left padding). A model whose
forward gets any other cache (or none) runs PyTorch's SDPA as before.

Tensors cross as data pointers on torch's current stream (``data_ptr()``; the library waits for
that stream and makes it wait for its own work): queries, keys and values of the new tokens go in
as float32 rows (one fused transpose + cast of the new tokens only), the attention output comes
back as float16 (device, fp16 models) or float32 rows. Nothing of the cache itself is ever
dequantised into a torch tensor.

Under ``torch.compile`` the attention is one opaque custom op, ``veloxquant::attend`` (the cache's
bookkeeping is Python state that a traced graph must not burn in): a decode step compiles to a
single graph, later steps and fresh caches reuse it, and ``generate`` compiles its decode steps
for this cache (``is_compileable``). The op is tagged cudagraph-unsafe, so with mode
"reduce-overhead" inductor's graph partition CUDA-graphs the rest of each layer around it.

A cache sized up front (``max_batch_size`` and ``max_cache_len``, as transformers' StaticCache) runs
its decode steps inside those CUDA graphs instead: one cudagraph-unsafe op per step
(``veloxquant::begin_decode``: the step's host work, at the first layer) and per layer an op with no
host work at all (``veloxquant::attend_decode``: launches on fixed device buffers, replayable). Each
such cache carries an "anchor", a one-element device tensor at an address no other cache ever gets,
marked as a static input: a new cache changes it, which makes inductor record the graphs again
instead of replaying another cache's launches. Prefill steps (several tokens) take the first op.

The native part is ``libveloxquant_torch.so`` (python/torch_bridge), a C ABI loaded with
ctypes: it needs neither torch's nor Python's headers, so one build serves any torch and any
Python. ``VQ_TORCH_LIB`` names another copy (read once, at import).

``calibrate(model, tokenizer, texts, spec, path)`` records the post-RoPE keys, values and query
energies of every layer while the model runs the texts and writes the same calibration file as
``veloxquant calibrate``.
"""

from __future__ import annotations

import ctypes
import math
import os
import weakref

import torch

__all__ = ["VeloxQuantCache", "cache", "calibrate", "random_calibration", "cuda_available", "ATTN_NAME"]

ATTN_NAME = "veloxquant"
_RECORD_NAME = "veloxquant_record"

# ---------------------------------------------------------------------------------------------
# The native library


def _load_library():
    path = os.environ.get("VQ_TORCH_LIB") or os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                           "libveloxquant_torch.so")
    if not os.path.exists(path):
        raise ImportError(f"veloxquant.torch: {path} not found (build the package with `pip install .`, "
                          "or set VQ_TORCH_LIB to a built libveloxquant_torch.so)")
    lib = ctypes.CDLL(path)
    P, I, I64, F, S = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float, ctypes.c_char_p
    sig = {
        "vqt_last_error": (S, []),
        "vqt_cuda_available": (I, []),
        "vqt_cuda_unavailable_reason": (S, []),
        "vqt_create": (P, [I, I, I, I, S, S, I, I64, P]),
        "vqt_destroy": (None, [P]),
        "vqt_name": (S, [P]),
        "vqt_is_device": (I, [P]),
        "vqt_batch": (I, [P]),
        "vqt_seq_len": (I64, [P, I]),
        "vqt_reset": (I, [P, I]),
        "vqt_select": (I, [P, I, P, I64]),
        "vqt_begin": (I, [P, I, P]),
        "vqt_layer": (I, [P, I, P, P, P, P, I, F, P]),
        "vqt_reserve": (I, [P, I, I64]),
        "vqt_begin_graph": (I, [P, I, P]),
        "vqt_layer_graph": (I, [P, I, P, P, P, P, I, F, P]),
        "vqt_abort_step": (None, [P]),
        "vqt_memory": (I64, [P, I]),
        "vqt_train_calibration": (I, [S, I, I, I, P, P, I64, I, I, P, P, I, I, P, I, I, S, S]),
        "vqt_random_calibration": (I, [S, I, I, I, ctypes.c_uint64, S]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    return lib


_lib = _load_library()


class Error(RuntimeError):
    """A library error (the message names what is wrong)."""


def _check(rc):
    if rc < 0:
        raise Error(_lib.vqt_last_error().decode("utf-8", "replace"))
    return rc


def cuda_available() -> bool:
    """True when the library has its CUDA backend and a usable GPU is present."""
    return bool(_lib.vqt_cuda_available())


def _int_array(values, ctype=ctypes.c_int):
    return (ctype * len(values))(*values)


# ---------------------------------------------------------------------------------------------
# The cache

try:  # transformers is needed for the Cache classes and the attention registration
    from transformers import AttentionInterface
    from transformers.cache_utils import Cache, CacheLayerMixin
    from transformers.masking_utils import AttentionMaskInterface
except ImportError as e:  # pragma: no cover - a clear message instead of a NameError later
    raise ImportError("veloxquant.torch needs transformers >= 5 (pip install transformers)") from e

# The layer whose update() ran last: the attention call of the same module follows it at once
# (transformers calls past_key_values.update() and then the attention function, which is not
# given the cache).
_pending = None


class VeloxQuantLayer(CacheLayerMixin):
    """One attention layer of a VeloxQuantCache: its keys and values live in the cache's pool."""

    # torch.compile: the attention runs as one opaque custom op (veloxquant::attend) that keeps the
    # Python bookkeeping out of the traced graph, so a compiled decode step has no graph break
    is_compileable = True
    is_sliding = False
    is_croppable = True

    def __init__(self, owner: "VeloxQuantCache", layer_idx: int):
        super().__init__()
        self._owner = owner
        self.layer_idx = layer_idx
        self._n = 0  # tokens this layer holds (batch row 0; rows differ only under left padding)

    def lazy_initialization(self, key_states, value_states) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        """Notes the layer for the attention call that follows; the keys and values are appended
        there (with the queries, in one call into the library). Returns the new states as given."""
        global _pending
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        _pending = self
        return key_states, value_states

    def get_seq_length(self) -> int:
        # Traced by torch.compile, a Python int would be burnt into the graph (a recompile per
        # step): there the length is a tensor the attention op updates in place (as transformers'
        # StaticLayer returns a tensor).
        if torch.compiler.is_compiling():
            return self._owner._len_t
        return self._n

    def get_mask_sizes(self, query_length: int, *args) -> tuple[int, int]:
        # The "veloxquant" mask function ignores the sizes (causality and windows come from
        # positions inside the library); under torch.compile they are left constant.
        if torch.compiler.is_compiling():
            return query_length, 0
        return self._n + query_length, 0

    def get_max_length(self) -> int:
        return self._owner._max_len or -1

    def get_max_cache_shape(self) -> int:
        return self._owner._max_len or -1

    # Batch-wide operations act on the whole pool at once: the cache does them (once), and a
    # layer-level call forwards to it.
    def reset(self) -> None:
        self._owner.reset()

    def reorder_cache(self, beam_idx) -> None:
        self._owner.reorder_cache(beam_idx)

    def crop(self, tokens_to_remove: int) -> None:
        self._owner.crop(tokens_to_remove)

    def batch_select_indices(self, indices) -> None:
        self._owner.batch_select_indices(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._owner.batch_repeat_interleave(repeats)

    def offload(self):
        pass

    def prefetch(self):
        pass


class VeloxQuantCache(Cache):
    """A transformers Cache over one VeloxQuant KV store (all layers, one sequence per batch row).

    spec: "fp16" or a VecInfer spec ("vecinfer:d4b8", ...; needs ``calib``) on the GPU; on the
    CPU every method ("q8_0", "kivi2", ...). device: "cuda" or "cpu" (default: where the model
    is; "cuda" needs the library's CUDA backend and a GPU). budget_mib: KV pool budget (0: none).
    """

    def __init__(self, n_layers, n_heads, n_kv_heads, head_dim, spec="fp16", calib=None, device="cpu",
                 budget_mib=0, sliding_windows=None, gguf_channel_order=False, max_batch_size=None,
                 max_cache_len=None, graph_decode=None):
        if device not in ("cpu", "cuda"):
            raise ValueError(f"veloxquant.torch: device '{device}' must be 'cpu' or 'cuda'")
        if (max_batch_size is None) != (max_cache_len is None):
            raise ValueError("veloxquant.torch: max_batch_size and max_cache_len go together (both or neither)")
        windows = None
        if sliding_windows is not None:
            if len(sliding_windows) != n_layers:
                raise ValueError(f"veloxquant.torch: {len(sliding_windows)} sliding windows for {n_layers} layers")
            windows = _int_array([int(w or 0) for w in sliding_windows])
        h = _lib.vqt_create(n_layers, n_heads, n_kv_heads, head_dim, spec.encode(),
                            (str(calib) if calib else "").encode(), 1 if device == "cuda" else 0, int(budget_mib),
                            ctypes.cast(windows, ctypes.c_void_p) if windows is not None else None)
        if not h:
            raise Error(_lib.vqt_last_error().decode("utf-8", "replace"))
        self._h = ctypes.c_void_p(h)
        self.spec = _lib.vqt_name(self._h).decode()
        self.device_kind = device
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.gguf_channel_order = bool(gguf_channel_order)
        self._next_layer = 0
        self._rows = None  # the open step: (batch, new tokens, flat indices of the real rows or None)
        # For torch.compile: the op finds this cache through a handle tensor (a graph input whose
        # value is never burnt in, so a new cache reuses the compiled graph), and the traced
        # get_seq_length reads the tokens held from _len_t (updated in place by the op).
        global _next_handle
        _next_handle += 1
        self._hid = _next_handle  # __del__ uses the int: a collection may run while torch traces (FakeTensorMode)
        self._handle = torch.tensor([_next_handle], dtype=torch.int64)
        self._len_t = torch.zeros((), dtype=torch.int64, device="cuda" if device == "cuda" else "cpu")
        _caches[_next_handle] = weakref.ref(self)
        super().__init__(layers=[VeloxQuantLayer(self, i) for i in range(n_layers)])
        # Sized up front: decode steps through the graph-safe ops (see the module's docstring).
        self._max_batch = self._max_len = None
        self._anchor = None
        if max_cache_len is not None:
            _check(_lib.vqt_reserve(self._h, int(max_batch_size), int(max_cache_len)))
            self._max_batch, self._max_len = int(max_batch_size), int(max_cache_len)
            if graph_decode is not False:  # None (the default) or True
                self._anchor = _new_anchor("cuda" if device == "cuda" else "cpu")
                _anchored[self._anchor.data_ptr()] = weakref.ref(self)
        elif graph_decode:
            raise ValueError("veloxquant.torch: graph_decode needs the cache sized up front (max_batch_size, "
                             "max_cache_len)")

    def __del__(self):
        hid = getattr(self, "_hid", None)
        if hid is not None and _caches is not None:
            _caches.pop(hid, None)
        anchor = getattr(self, "_anchor", None)
        if anchor is not None and _anchored is not None:
            _anchored.pop(anchor.data_ptr(), None)
        h = getattr(self, "_h", None)
        if h is not None and _lib is not None:
            _lib.vqt_destroy(h)
            self._h = None

    def __repr__(self):
        return f"VeloxQuantCache(spec={self.spec!r}, device={self.device_kind!r}, layers={len(self.layers)})"

    # ---- state
    @property
    def batch_size(self) -> int:
        return int(_lib.vqt_batch(self._h)) if _lib.vqt_batch(self._h) > 0 else -1

    def seq_lengths(self) -> list[int]:
        """Tokens each batch row holds (rows differ under left padding: pads are not stored)."""
        return [int(_check(_lib.vqt_seq_len(self._h, b))) for b in range(_lib.vqt_batch(self._h))]

    def memory(self) -> dict:
        """Bytes: tokens (payload of the rows' tokens), allocated (blocks the rows reference),
        fp16 (what an fp16 cache takes for the same tokens), pool (blocks in use), codebooks."""
        names = ("tokens", "allocated", "fp16", "pool", "codebooks")
        return {n: int(_check(_lib.vqt_memory(self._h, i))) for i, n in enumerate(names)}

    def _set_lengths(self, n):
        for layer in self.layers:
            layer._n = n
        self._len_t.fill_(n)

    def reset(self):
        _check(_lib.vqt_reset(self._h, 0))
        self._next_layer, self._rows = 0, None
        self._set_lengths(0)

    def _select(self, src, keep=-1):
        src = [int(i) for i in src]
        _lib.vqt_abort_step(self._h)
        self._next_layer, self._rows = 0, None
        _check(_lib.vqt_select(self._h, len(src), ctypes.cast(_int_array(src, ctypes.c_int64), ctypes.c_void_p),
                               int(keep)))

    def reorder_cache(self, beam_idx):
        self._select(beam_idx.tolist() if hasattr(beam_idx, "tolist") else beam_idx)

    def batch_select_indices(self, indices):
        if hasattr(indices, "dtype") and indices.dtype == torch.bool:
            indices = indices.nonzero().flatten()
        self._select(indices.tolist() if hasattr(indices, "tolist") else indices)

    def batch_repeat_interleave(self, repeats: int):
        self._select([b for b in range(_lib.vqt_batch(self._h)) for _ in range(repeats)])

    def crop(self, tokens_to_remove: int) -> None:
        """Negative: remove that many tokens; positive (transformers' legacy form): keep that many.
        A coded method can crop only to a point whose fp16 window it still holds (else Error)."""
        n = self.layers[0]._n
        keep = n + tokens_to_remove if tokens_to_remove <= 0 else min(tokens_to_remove, n)
        if keep == n:
            return
        if keep < 0:
            raise ValueError(f"veloxquant.torch: crop of {-tokens_to_remove} tokens, the cache holds {n}")
        lens = self.seq_lengths()
        if len(set(lens)) > 1:
            raise Error("veloxquant.torch: crop of a left-padded batch (rows of different lengths) is not supported")
        self._select(range(len(lens)), keep)
        self._set_lengths(keep)

    # ---- a forward
    def _take_batch(self, batch):
        """A forward of `batch` rows: an empty cache takes that many sequences; a filled one must
        hold as many."""
        if _lib.vqt_batch(self._h) == 0 or self.layers[0]._n == 0 and _lib.vqt_batch(self._h) != batch:
            _check(_lib.vqt_reset(self._h, batch))
        if _lib.vqt_batch(self._h) != batch:
            raise Error(f"veloxquant.torch: a forward of batch {batch}, the cache holds {_lib.vqt_batch(self._h)} "
                        "sequences (reset() it, or reorder/select with the generation's indices)")

    def _begin(self, batch, q_len, attention_mask):
        """Layer 0 of a forward: the step's rows. Left padding (a 2D mask whose new part starts
        with zeros) leaves the pads out of the pool."""
        self._take_batch(batch)
        counts, idx = [q_len] * batch, None
        if q_len > 1 and attention_mask is not None and attention_mask.dim() == 2:
            new = attention_mask[:, -q_len:].to(torch.bool)
            if not bool(new.all()):
                counts = new.sum(dim=1).tolist()
                for b, c in enumerate(counts):
                    if not bool(new[b, q_len - c:].all()):
                        raise Error("veloxquant.torch: padding inside or after the tokens of batch row "
                                    f"{b}: only left padding is supported")
                idx = new.flatten().nonzero().flatten()
        _check(_lib.vqt_begin(self._h, batch, ctypes.cast(_int_array(counts), ctypes.c_void_p)))
        self._rows = (batch, q_len, idx)
        self._next_layer = 0

    def _rows_of(self, x, qk):
        """[B, H, T, D] -> [B*T, H*D] float32 rows, contiguous (traced by torch.compile: one fused
        transpose + cast of the new tokens)."""
        B, H, T, D = x.shape
        x = x.transpose(1, 2)
        if qk and self.gguf_channel_order:
            x = _to_gguf_order(x)
        return x.reshape(B * T, H * D).to(torch.float32).contiguous()

    def _attend(self, layer, query, key, value, attention_mask, scaling):
        """The attention of one layer: the new tokens' rows cross into the library through the
        veloxquant::attend op. Returns [B, T, Hq, D] in the query's dtype."""
        B, Hq, T, D = query.shape
        dev = self.device_kind == "cuda"
        out_f16 = dev and query.dtype == torch.float16
        mask = attention_mask if attention_mask is not None and attention_mask.dim() == 2 else None
        if attention_mask is not None and attention_mask.dim() != 2:
            raise Error("veloxquant.torch: a 4D attention mask was given; the veloxquant attention takes the "
                        "2D padding mask only")
        if self._anchor is not None and T == 1:  # a decode step of a cache sized up front
            step = torch.ops.veloxquant.begin_decode(self._anchor, B) if layer.layer_idx == 0 else None
            out = torch.ops.veloxquant.attend_decode(self._rows_of(query, True), self._rows_of(key, True),
                                                     self._rows_of(value, False), step, self._anchor,
                                                     layer.layer_idx, B, float(scaling), out_f16)
        else:
            out = torch.ops.veloxquant.attend(self._rows_of(query, True), self._rows_of(key, True),
                                              self._rows_of(value, False), mask, self._handle, layer.layer_idx, B,
                                              T, float(scaling), out_f16)
        return out.view(B, T, Hq, D).to(query.dtype)

    def _begin_decode(self, batch, device):
        """Eager body of veloxquant::begin_decode: a decode step's host work (every row one token)."""
        if self._rows is not None:
            raise Error(f"veloxquant.torch: a decode step began while layer {self._next_layer} of the last "
                        "forward was expected")
        self._take_batch(batch)
        dev = self.device_kind == "cuda"
        if dev != (device.type == "cuda"):
            raise Error(f"veloxquant.torch: a {self.device_kind} cache got tensors on {device}")
        stream = torch.cuda.current_stream(device).cuda_stream if dev else 0
        _check(_lib.vqt_begin_graph(self._h, batch, ctypes.c_void_p(stream)))
        for layer in self.layers:
            layer._n += 1

    def _attend_decode_rows(self, layer_idx, q, k, v, scaling, out_f16):
        """Eager body of veloxquant::attend_decode: one layer's launches (or the cpu store's work),
        nothing else on the host, so that a CUDA graph may record it once and replay it."""
        out = torch.empty((q.shape[0], q.shape[1]), dtype=torch.float16 if out_f16 else torch.float32,
                          device=q.device)
        stream = torch.cuda.current_stream(q.device).cuda_stream if q.device.type == "cuda" else 0
        _check(_lib.vqt_layer_graph(self._h, layer_idx, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                                    1 if out_f16 else 0, float(scaling), ctypes.c_void_p(stream)))
        if layer_idx == len(self.layers) - 1:
            self._len_t.add_(1)  # on the device, in the graph: replays advance it too
        return out

    def _attend_rows(self, layer_idx, q, k, v, attention_mask, batch, q_len, scaling, out_f16):
        """Eager body of veloxquant::attend: the step's bookkeeping (layer 0 opens it), the pads
        left out, one call into the library, the pads' rows zero."""
        layer = self.layers[layer_idx]
        if layer_idx == 0:
            self._begin(batch, q_len, attention_mask)
        if self._rows is None or layer_idx != self._next_layer:
            raise Error(f"veloxquant.torch: layer {layer_idx} ran out of order (layer {self._next_layer} "
                        "expected)")
        _, _, idx = self._rows
        dev = self.device_kind == "cuda"
        if dev and q.device.type != "cuda":
            raise Error("veloxquant.torch: a cuda cache got tensors on " + str(q.device))
        if not dev and q.device.type != "cpu":
            raise Error("veloxquant.torch: a cpu cache got tensors on " + str(q.device))
        if idx is not None:
            q, k, v = q.index_select(0, idx), k.index_select(0, idx), v.index_select(0, idx)
        out = torch.empty((q.shape[0], q.shape[1]), dtype=torch.float16 if out_f16 else torch.float32,
                          device=q.device)
        stream = torch.cuda.current_stream(q.device).cuda_stream if dev else 0
        rc = _lib.vqt_layer(self._h, layer_idx, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                            1 if out_f16 else 0, float(scaling), ctypes.c_void_p(stream))
        if rc < 0:
            _lib.vqt_abort_step(self._h)
            self._rows = None
            _check(rc)
        layer._n += q_len
        self._next_layer = layer_idx + 1
        if self._next_layer == len(self.layers):
            self._rows, self._next_layer = None, 0
            self._len_t.fill_(layer._n)
        if idx is not None:
            full = torch.zeros((batch * q_len, out.shape[1]), dtype=out.dtype, device=out.device)
            full.index_copy_(0, idx, out)
            out = full
        return out


# The cache of a veloxquant::attend call: handle -> weak reference (a handle is a one-element
# int64 tensor held by the cache, so a compiled graph takes it as an input, not a constant).
_caches = {}
_next_handle = 0
_OP_TAGS = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()


@torch.library.custom_op("veloxquant::attend", mutates_args=(), tags=_OP_TAGS)
def _attend_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attention_mask: torch.Tensor | None,
               handle: torch.Tensor, layer: int, batch: int, q_len: int, scaling: float,
               out_f16: bool) -> torch.Tensor:
    """One layer's attention through a VeloxQuantCache: q/k/v are the new tokens' float32 rows
    [batch*q_len, heads*head_dim]; the keys and values are appended to the pool and the queries
    attend over it. Opaque to torch.compile (the cache's bookkeeping is Python state); tagged
    cudagraph-unsafe, so a CUDA-graphed graph is split around it."""
    ref = _caches.get(int(handle[0]))
    c = ref() if ref is not None else None
    if c is None:
        raise Error("veloxquant.torch: the cache of this attention call no longer exists")
    return c._attend_rows(layer, q, k, v, attention_mask, batch, q_len, scaling, out_f16)


@_attend_op.register_fake
def _attend_fake(q, k, v, attention_mask, handle, layer, batch, q_len, scaling, out_f16):
    return q.new_empty((batch * q_len, q.shape[1]), dtype=torch.float16 if out_f16 else torch.float32)


# Caches sized up front, by their anchor's address. Anchors are slices of blocks that are never
# freed, so no two caches of a process ever share an address (a captured graph records it).
_anchored = {}
_anchor_blocks = {}  # device -> [block tensor, next free slot]
_anchor_keep = []    # every block ever made (a freed block's addresses could come back)
_ANCHOR_BLOCK = 4096
# Anchors 64 bytes apart: inductor clones a GPU input that it compiled as 16-byte aligned and later
# meets misaligned (compile_fx's copy_misaligned_inputs), and a cloned anchor names no cache.
_ANCHOR_STRIDE = 16


def _new_anchor(device):
    blk = _anchor_blocks.get(device)
    if blk is None or blk[1] == _ANCHOR_BLOCK:
        blk = _anchor_blocks[device] = [torch.zeros(_ANCHOR_BLOCK, dtype=torch.int32, device=device), 0]
        _anchor_keep.append(blk[0])
    a = blk[0][blk[1]:blk[1] + 1]
    blk[1] += _ANCHOR_STRIDE
    # unguarded: a new address makes inductor's CUDA graphs record again (no recompile)
    torch._dynamo.mark_static_address(a, guard=False)
    return a


def _anchored_cache(anchor):
    ref = _anchored.get(anchor.data_ptr())
    c = ref() if ref is not None else None
    if c is None:
        raise Error("veloxquant.torch: no cache owns this anchor (the cache was deleted, or a compiled graph "
                    "copied its anchor instead of taking it as a static input)")
    return c


@torch.library.custom_op("veloxquant::begin_decode", mutates_args=(), tags=_OP_TAGS)
def _begin_decode_op(anchor: torch.Tensor, batch: int) -> torch.Tensor:
    """A decode step of a cache sized up front (one token per row): all of the step's host work
    (blocks, tables, descriptors, the fix-up). Tagged cudagraph-unsafe: it runs at every step."""
    _anchored_cache(anchor)._begin_decode(batch, anchor.device)
    return anchor.new_empty((0,))


@_begin_decode_op.register_fake
def _begin_decode_fake(anchor, batch):
    return anchor.new_empty((0,))


@torch.library.custom_op("veloxquant::attend_decode", mutates_args=())
def _attend_decode_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, step: torch.Tensor | None,
                      anchor: torch.Tensor, layer: int, batch: int, scaling: float, out_f16: bool) -> torch.Tensor:
    """One layer's attention in a decode step opened by veloxquant::begin_decode (``step``, its
    output, orders the first layer after it): launches only, so CUDA graphs may capture it."""
    return _anchored_cache(anchor)._attend_decode_rows(layer, q, k, v, scaling, out_f16)


@_attend_decode_op.register_fake
def _attend_decode_fake(q, k, v, step, anchor, layer, batch, scaling, out_f16):
    return q.new_empty((batch, q.shape[1]), dtype=torch.float16 if out_f16 else torch.float32)


def _to_gguf_order(x):
    """Channels of each head [..., D] from transformers' order to llama.cpp's: transformers loads a
    llama-family GGUF with each head's q/k channels un-interleaved (its RoPE rotates halves), so
    channel j < D/2 is the GGUF's 2j and D/2 + j its 2j + 1. q and k permuted alike keep q.k."""
    D = x.shape[-1]
    return x.unflatten(-1, (2, D // 2)).transpose(-1, -2).flatten(-2)


def _sdpa_fallback(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention without a VeloxQuant cache: PyTorch's SDPA (the mask built from the 2D padding
    mask that transformers passes to a custom attention)."""
    B, Hq, T, D = query.shape
    S = key.shape[2]
    if key.shape[1] != Hq:
        rep = Hq // key.shape[1]
        key = key.repeat_interleave(rep, dim=1)
        value = value.repeat_interleave(rep, dim=1)
    mask = None
    if attention_mask is not None and attention_mask.dim() == 4:
        mask = attention_mask
    else:
        i = torch.arange(T, device=query.device).view(T, 1) + (S - T)
        j = torch.arange(S, device=query.device).view(1, S)
        mask = (j <= i).view(1, 1, T, S)
        window = getattr(module, "sliding_window", None)
        if window:
            mask = mask & (j > i - window).view(1, 1, T, S)
        if attention_mask is not None and attention_mask.dim() == 2:
            mask = mask & attention_mask[:, -S:].to(torch.bool).view(B, 1, 1, S)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout if module.training else 0.0, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def veloxquant_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The "veloxquant" attention: through the cache's pool when the forward's cache is a
    VeloxQuantCache, else SDPA. Returns (attn_output [B, T, H, D], None)."""
    global _pending
    layer, _pending = _pending, None
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    if layer is None or layer.layer_idx != getattr(module, "layer_idx", layer.layer_idx):
        return _sdpa_fallback(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    return layer._owner._attend(layer, query, key, value, attention_mask, scaling), None


def _padding_mask(batch_size=None, q_length=None, kv_length=None, q_offset=None, kv_offset=None, mask_function=None,
                  attention_mask=None, **kwargs):
    """The mask transformers builds for the "veloxquant" attention: the 2D padding mask as given
    (None without padding). Causality and windows come from positions inside the library, so no
    [B, 1, q, kv] mask is ever materialised (at 32K tokens that is a gigabyte per forward)."""
    if torch.compiler.is_compiling():
        # no data-dependent test in a traced graph; a decode step's pads are not in the pool, so
        # its mask is not needed (and its growing length would recompile every step)
        return attention_mask if q_length is not None and q_length > 1 else None
    if attention_mask is not None and attention_mask.dim() == 2 and bool(attention_mask.all()):
        return None
    return attention_mask


AttentionInterface.register(ATTN_NAME, veloxquant_attention)
AttentionMaskInterface.register(ATTN_NAME, _padding_mask)


def _geometry(config):
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    n_heads = cfg.num_attention_heads
    n_kv = getattr(cfg, "num_key_value_heads", None) or n_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
    n_layers = cfg.num_hidden_layers
    windows = None
    layer_types = getattr(cfg, "layer_types", None)
    sw = getattr(cfg, "sliding_window", None)
    if layer_types and sw:
        windows = [int(sw) if t == "sliding_attention" else 0 for t in layer_types]
    elif sw and getattr(cfg, "use_sliding_window", True) and cfg.model_type in ("mistral",):
        windows = [int(sw)] * n_layers
    if windows is not None and not any(windows):
        windows = None
    return n_layers, n_heads, n_kv, head_dim, windows


def cache(model, spec="fp16", calib=None, device=None, budget_mib=0, set_attention=True,
          gguf_channel_order=False, max_batch_size=None, max_cache_len=None, graph_decode=None) -> VeloxQuantCache:
    """A VeloxQuantCache for a transformers model (llama / qwen2 / qwen3 / mistral family) and
    the model's attention switched to "veloxquant" (set_attention=False: leave it; then call
    ``model.set_attn_implementation("veloxquant")`` yourself). device: default where the model's
    parameters are.

    Calibration files hold per-channel factors and codebooks over consecutive channels, so they
    belong to one channel order: a file from ``calibrate()`` fits the model it ran on. A file
    written by ``veloxquant calibrate`` on a llama/mistral GGUF fits the model transformers loads
    from that GGUF only with gguf_channel_order=True (transformers un-interleaves those models'
    q/k channels; measured on SmolLM2: KL 0.81 without, 0.08 with). qwen2/qwen3 GGUFs keep one
    order (leave it False).

    max_batch_size, max_cache_len: size the cache up front, as transformers' StaticCache, for decode
    steps under torch.compile(mode="reduce-overhead"): the attention then runs inside the CUDA
    graphs (see the module's docstring); rows past max_cache_len tokens are refused.
    graph_decode (sized caches): None (default) or True runs decode steps through the graph-safe ops
    (docs/CUDA_NOTES.md 9a), every method on either device; False keeps the cudagraph-unsafe op (a
    graph break around every layer's attention). An unsized cache refuses True."""
    n_layers, n_heads, n_kv, head_dim, windows = _geometry(model.config)
    if device is None:
        device = "cuda" if next(model.parameters()).device.type == "cuda" else "cpu"
    c = VeloxQuantCache(n_layers, n_heads, n_kv, head_dim, spec, calib, device, budget_mib, windows,
                        gguf_channel_order, max_batch_size, max_cache_len, graph_decode)
    if set_attention and getattr(model.config, "_attn_implementation", None) != ATTN_NAME:
        model.set_attn_implementation(ATTN_NAME)
    return c


# ---------------------------------------------------------------------------------------------
# Calibration

_recorder = None


def _recording_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    rec = _recorder
    if rec is not None:
        rec.add(module.layer_idx, query, key, value)
    return _sdpa_fallback(module, query, key, value, attention_mask, scaling, dropout, **kwargs)


AttentionInterface.register(_RECORD_NAME, _recording_attention)
AttentionMaskInterface.register(_RECORD_NAME, _padding_mask)


class _Recorder:
    def __init__(self, n_layers, n_kv, head_dim, gguf_order=False, moment=True):
        self.gguf_order = gguf_order
        self.k = [[] for _ in range(n_layers)]
        self.v = [[] for _ in range(n_layers)]
        self.qe = [torch.zeros(n_kv, head_dim, dtype=torch.float64) for _ in range(n_layers)]
        # the queries' second moment, only for the learned key transform (moment)
        self.qm = [torch.zeros(n_kv, head_dim, head_dim, dtype=torch.float64) for _ in range(n_layers)] if moment else None
        self.n_kv = n_kv

    def add(self, layer, q, k, v):
        # [B=1, H, T, D] -> [T, H, D] f32 on the CPU; query energy: sum of q^2 per KV head's group
        if self.gguf_order:
            q, k = _to_gguf_order(q), _to_gguf_order(k)
        self.k[layer].append(k[0].transpose(0, 1).to(torch.float32).cpu())
        self.v[layer].append(v[0].transpose(0, 1).to(torch.float32).cpu())
        Hq, D = q.shape[1], q.shape[3]
        q64 = q[0].to(torch.float64)  # [Hq, T, D]
        e = q64.pow(2).sum(dim=1)  # [Hq, D]
        self.qe[layer] += e.view(self.n_kv, Hq // self.n_kv, D).sum(dim=1).cpu()
        # the second moment of each KV head's query rows: [n_kv, D, D] (the learned key transform)
        if self.qm is not None:
            g = q64.reshape(self.n_kv, -1, D)
            self.qm[layer] += torch.matmul(g.transpose(1, 2), g).cpu()


# The rotated key mean's segment: the CLI's (kKeyMeanTokens, eval/calibrate.h).
_KEY_MEAN_TOKENS = 16


def _rope_freqs(model, head_dim):
    """The model's rotary inverse frequencies (radians per token, [n_rot / 2] floats) from its one
    rotary embedding module, or None where they are not read here: no such module, or several
    (per-layer-type rotary embeddings, e.g. Gemma 3's local and global bases)."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if getattr(cfg, "rope_local_base_freq", None):
        return None
    found = []
    for _, mod in model.named_modules():
        for name, buf in mod.named_buffers(recurse=False):
            if "inv_freq" in name and isinstance(buf, torch.Tensor):
                found.append((name, buf))
    # transformers keeps the table in use as inv_freq (and the unscaled one as original_inv_freq);
    # any other name is a second table (per layer type), whose layers are not told apart here
    if not found or not {n for n, _ in found} <= {"inv_freq", "original_inv_freq"}:
        return None
    used = [b.detach().to(torch.float64).cpu() for n, b in found if n == "inv_freq"]
    if not used or any(not torch.equal(b, used[0]) for b in used[1:]):
        return None
    f = used[0]
    if f.ndim != 1 or f.numel() == 0 or 2 * f.numel() > head_dim or not bool((f > 0).all()):
        return None
    return f.tolist()


@torch.no_grad()
def calibrate(model, tokenizer, texts, spec="vecinfer:d4b8", path=None, max_tokens=8192, segment_tokens=2048,
              skip_tokens=4, gguf_channel_order=False, model_name=None, key_transform="auto",
              key_mean="auto") -> str:
    """Records every layer's post-RoPE keys, values and queries while the model runs ``texts`` (a
    string or a list of strings, joined by blank lines; at most max_tokens tokens, run as
    independent sequences of segment_tokens) and trains and writes a VecInfer calibration file for
    ``spec`` as ``veloxquant calibrate`` does: query-aware smoothing, the first skip_tokens of each
    sequence left out, and the key transform (key_transform: "learned", a dense map per layer and KV
    head from the keys' covariance and the queries' second moment; "hadamard", the smoothing and the
    Walsh-Hadamard rotation; "auto", learned for per-sub-space books from at least 16 tokens per key
    channel, as the CLI). key_mean: "rotated", the keys' pre-RoPE mean is fitted, removed before the
    codebooks train and added back exactly in attention (the CLI's `--key-mean rotated`, 16-token
    segments; needs the rotary frequencies, read from the model's one rotary embedding); "none";
    "auto" (default): rotated where the frequencies can be read, as the CLI's default. Not here (the
    CLI's calibrate has it): the recording's random positions. Returns the file's path (default:
    <spec>.vqcal).
    gguf_channel_order=True (a llama/mistral model loaded from a GGUF): the file is written in the
    GGUF's channel order, for the CLI on that GGUF and for cache(..., gguf_channel_order=True).
    model_name: the name the file records (the CLI accepts a file whose name is the GGUF's file
    name, its stem or its general.name); default: the last part of the model's name_or_path."""
    global _recorder
    transforms = {"auto": -1, "hadamard": 0, "learned": 1}
    if key_transform not in transforms:
        raise ValueError(f"calibrate: key_transform {key_transform!r} is not one of {sorted(transforms)}")
    if key_mean not in ("auto", "rotated", "none"):
        raise ValueError(f"calibrate: key_mean {key_mean!r} is not one of ['auto', 'none', 'rotated']")
    if isinstance(texts, str):
        texts = [texts]
    text = "\n\n".join(texts)
    ids = tokenizer(text, return_tensors="pt").input_ids[0][:max_tokens]
    if ids.numel() < 16:
        raise ValueError(f"calibrate: the text gives only {ids.numel()} tokens (>= 16 needed)")
    n_layers, n_heads, n_kv, head_dim, _ = _geometry(model.config)
    freqs = _rope_freqs(model, head_dim) if key_mean != "none" else None
    if key_mean == "rotated" and freqs is None:
        raise ValueError("calibrate: key_mean='rotated' needs the model's rotary frequencies, which are read from "
                         "one rotary embedding module with an inv_freq buffer (this model has none or several); "
                         "use key_mean='none'")
    dev = next(model.parameters()).device
    old = model.config._attn_implementation
    rec = _Recorder(n_layers, n_kv, head_dim, gguf_channel_order, moment=key_transform != "hadamard")
    model.set_attn_implementation(_RECORD_NAME)
    _recorder = rec
    try:
        for s0 in range(0, ids.numel(), segment_tokens):
            seg = ids[s0:s0 + segment_tokens].view(1, -1).to(dev)
            model(input_ids=seg, use_cache=False)
    finally:
        _recorder = None
        model.set_attn_implementation(old)
    n = int(ids.numel())
    ks = [torch.cat(x).contiguous() for x in rec.k]
    vs = [torch.cat(x).contiguous() for x in rec.v]
    for l in range(n_layers):
        if ks[l].shape[0] != n:
            raise Error(f"calibrate: layer {l} recorded {ks[l].shape[0]} tokens of {n}")
    qe = [(x / (n * (n_heads // n_kv))).contiguous() for x in rec.qe]
    kp = (ctypes.c_void_p * n_layers)(*[t.data_ptr() for t in ks])
    vp = (ctypes.c_void_p * n_layers)(*[t.data_ptr() for t in vs])
    qp = (ctypes.c_void_p * n_layers)(*[t.data_ptr() for t in qe])
    qm = [(x / (n * (n_heads // n_kv))).contiguous() for x in rec.qm] if rec.qm is not None else None
    mp = ctypes.cast((ctypes.c_void_p * n_layers)(*[t.data_ptr() for t in qm]), ctypes.c_void_p) if qm else None
    if path is None:
        path = spec.replace(":", "_").replace(",", "_").replace("=", "") + ".vqcal"
    name = model_name or os.path.basename(str(getattr(model.config, "_name_or_path", "")).rstrip("/")) \
        or model.config.model_type
    # GGUF's llama order pairs rotary channels (2i, 2i + 1); transformers' pairs (i, i + n_rot / 2).
    fr = (ctypes.c_double * (n_layers * len(freqs)))(*(freqs * n_layers)) if freqs else None
    _check(_lib.vqt_train_calibration(spec.encode(), n_layers, n_kv, head_dim, ctypes.cast(kp, ctypes.c_void_p),
                                      ctypes.cast(vp, ctypes.c_void_p), n, min(segment_tokens, n), skip_tokens,
                                      ctypes.cast(qp, ctypes.c_void_p), mp, transforms[key_transform],
                                      _KEY_MEAN_TOKENS if freqs else 0,
                                      ctypes.cast(fr, ctypes.c_void_p) if fr else None, 2 * len(freqs) if freqs else 0,
                                      0 if gguf_channel_order else 1, str(name).encode(), str(path).encode()))
    return str(path)


def random_calibration(spec, n_layers, n_kv_heads, head_dim, path, seed=1):
    """Writes a calibration with random codebooks (speed work at a model's shape, random weights)."""
    _check(_lib.vqt_random_calibration(spec.encode(), n_layers, n_kv_heads, head_dim, seed, str(path).encode()))
    return str(path)
