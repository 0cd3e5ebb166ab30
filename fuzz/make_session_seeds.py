#!/usr/bin/env python3
"""Writes the seed corpus of the session-file fuzz target (fuzz/fuzz_session.cpp) into
fuzz/corpus_session: valid version-2 session files for the target's reading cache (2 layers,
blocks of 4 tokens, 1 KV head of 32, fp16 dense blocks of 512 bytes, layer 1 coded blocks of 68
bytes) holding 0, 3, 4 and 9 tokens of KV with several block forms, and a split (tensor-parallel)
file of two ranks' parts. Layouts: src/kvcache/seq_file.h, src/kvcache/seq_file_format.h."""
import hashlib
import os
import random
import struct

DENSE, CODED = 512, [0, 68]


def session(n_kv, n_tokens, forms_of, seed):
    rng = random.Random(seed)
    names = (b"fuzz.gguf", b"fuzz")
    body = bytearray()
    body += b"VQKVSES\0" + struct.pack("<IIQ", 2, 96, 0)
    body += struct.pack("<QQQ", 0x1111111111111111, 0x2222222222222222, 0)
    body += struct.pack("<IIIIQ", 2, 4, 1, 32, DENSE)
    body += struct.pack("<qQII", n_kv, n_tokens, len(names[0]), len(names[1]))
    body += names[0] + names[1]
    body += b"".join(struct.pack("<i", rng.randrange(49152)) for _ in range(n_tokens))
    nb = (n_kv + 3) // 4
    for layer in range(2):
        forms = [forms_of(layer, j) for j in range(nb)]
        body += struct.pack("<QI", CODED[layer], nb) + bytes(forms)
        for f in forms:
            if f & 1:  # fp16 values in [-2, 2)
                body += b"".join(struct.pack("<e", rng.uniform(-2, 2)) for _ in range(DENSE // 2))
            if f & 2:  # a scale, then codes
                body += struct.pack("<e", rng.uniform(0, 1)) + bytes(rng.randrange(256) for _ in range(66))
    struct.pack_into("<Q", body, 16, len(body) + 32)
    return bytes(body) + hashlib.sha256(body).digest()


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus_session")
    os.makedirs(out, exist_ok=True)
    seeds = {
        "empty": session(0, 0, lambda l, j: 0, 1),
        "pending_tokens": session(0, 5, lambda l, j: 0, 2),
        "dense_partial": session(3, 4, lambda l, j: 1, 3),
        "dense_full": session(4, 4, lambda l, j: 1, 4),
        "mixed_forms": session(9, 12, lambda l, j: (3 if j < 2 else 1) if l == 1 else 1, 5),
        "coded_only": session(8, 8, lambda l, j: 2 if l == 1 else 1, 6),
    }
    # a split (tensor-parallel) file of two ranks' parts: "VQKVTPS\0" | u32 1 | u32 tp | u64 file
    # bytes | u64 part bytes[tp] | parts | SHA-256
    parts = [session(4, 4, lambda l, j: 1, 7), session(4, 4, lambda l, j: 1, 7)]
    head = b"VQKVTPS\0" + struct.pack("<IIQ", 1, 2, 24 + 16 + sum(map(len, parts)) + 32)
    head += b"".join(struct.pack("<Q", len(p)) for p in parts)
    body = head + b"".join(parts)
    seeds["split_two_ranks"] = body + hashlib.sha256(body).digest()
    for name, data in seeds.items():
        with open(os.path.join(out, name + ".vqkv"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
