"""Builders of bad inputs for tests/python/test_bad_input_corpus.py: byte-level edits of GGUF
files and a writer of VeloxQuant calibration files (the format of src/codec/calibration_file.h,
with its XXH64 checksum implemented here from the xxHash specification)."""
import struct

import numpy as np
import gguf

# ---------------------------------------------------------------- XXH64 (seed 0)
_P1, _P2, _P3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
_P4, _P5, _M = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5, (1 << 64) - 1


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & _M


def _round(acc, lane):
    return (_rotl((acc + lane * _P2) & _M, 31) * _P1) & _M


def xxh64(data: bytes, seed: int = 0) -> int:
    n, i = len(data), 0
    if n >= 32:
        v = [(seed + _P1 + _P2) & _M, (seed + _P2) & _M, seed, (seed - _P1) & _M]
        while i + 32 <= n:
            for k in range(4):
                v[k] = _round(v[k], struct.unpack_from("<Q", data, i + 8 * k)[0])
            i += 32
        acc = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M
        for k in range(4):
            acc = ((acc ^ _round(0, v[k])) * _P1 + _P4) & _M
    else:
        acc = (seed + _P5) & _M
    acc = (acc + n) & _M
    while i + 8 <= n:
        acc = (_rotl(acc ^ _round(0, struct.unpack_from("<Q", data, i)[0]), 27) * _P1 + _P4) & _M
        i += 8
    if i + 4 <= n:
        acc = (_rotl(acc ^ (struct.unpack_from("<I", data, i)[0] * _P1 & _M), 23) * _P2 + _P3) & _M
        i += 4
    while i < n:
        acc = (_rotl(acc ^ (data[i] * _P5 & _M), 11) * _P1) & _M
        i += 1
    acc ^= acc >> 33
    acc = acc * _P2 & _M
    acc ^= acc >> 29
    acc = acc * _P3 & _M
    return acc ^ (acc >> 32)


# ---------------------------------------------------------------- calibration files
_HEADER = "<8sII" + "I" * 10 + "QQI"  # magic, version, header_bytes, 10 u32, seed, tokens, model_len
_FIXED = 80  # the header_bytes the writer stores for the fixed part (calibration_file.cpp)


def hadamard_block(d):
    return d & -d


def calibration_bytes(layers, heads, head_dim, key=(4, 8), value=(4, 8), shared=False, seed=0, model=b"tiny",
                      check=None, key_mean=None):
    """A valid calibration file: positive smoothing, N(0,1) codebooks. Returns (bytes, payload
    offsets {"smoothing": [...], "key": [...], "value": [...]} per layer, for edits). check: None
    for a version-1 file, else (tokens, kl, top1, ppl_ratio), the held-out check of version 2.
    key_mean: (tokens, neox, n_rot) for a version-3 file with a rotated key mean (N(0,1) means,
    frequencies 10000^(-2i/n_rot)); it needs a check."""
    rng = np.random.default_rng(seed)
    version = 1 if check is None else 2 if key_mean is None else 3
    extra = (0 if check is None else 28) + (0 if key_mean is None else 12)
    head = struct.pack(_HEADER[:-1], b"VQCALIB\0", version,
                       _FIXED + len(model) + extra, layers, heads, head_dim, key[0], key[1],
                       value[0], value[1], 0 if shared else 1, hadamard_block(head_dim), 3, seed, 64)
    if check is not None:
        head += struct.pack("<Iddd", *check)
    if key_mean is not None:
        head += struct.pack("<III", key_mean[0], 1 if key_mean[1] else 0, key_mean[2])
    out = bytearray(head + struct.pack("<I", len(model)))
    out += model
    where = {"smoothing": [], "key": [], "value": []}
    for _ in range(layers):
        where["smoothing"].append(len(out))
        out += (0.5 + np.abs(rng.standard_normal(heads * head_dim))).astype("<f4").tobytes()
        for side, (d, b) in (("key", key), ("value", value)):
            books = 1 if shared else head_dim // d
            where[side].append(len(out))
            out += rng.standard_normal(heads * books * (1 << b) * d).astype("<f4").tobytes()
        if key_mean is not None:
            n_rot = key_mean[2]
            out += rng.standard_normal(heads * head_dim).astype("<f4").tobytes()
            out += (10000.0 ** (-2.0 * np.arange(n_rot // 2) / n_rot)).astype("<f8").tobytes()
    out += struct.pack("<Q", xxh64(bytes(out)))
    return bytes(out), where


def with_float(data: bytes, at: int, value: float, fix_checksum=True) -> bytes:
    """data with the f32 at byte `at` replaced; the checksum rewritten to match unless told."""
    b = bytearray(data)
    struct.pack_into("<f", b, at, value)
    if fix_checksum:
        struct.pack_into("<Q", b, len(b) - 8, xxh64(bytes(b[:-8])))
    return bytes(b)


# ---------------------------------------------------------------- GGUF edits
def tensor_fields(path, name):
    """(offset of the type u32, offset of the data-offset u64) in the tensor info of `name`."""
    t = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == name)
    at = t.field.offset + 8 + len(name.encode()) + 4 + 8 * len(t.shape)
    return at, at + 4


def poke(path, at, fmt, value):
    b = bytearray(path.read_bytes())
    struct.pack_into(fmt, b, at, value)
    path.write_bytes(bytes(b))
