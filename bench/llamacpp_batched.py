"""llama.cpp's batched decode, the peer of `veloxquant bench e2e`: B sequences of `ctx` cached
tokens each decode one token per step together (llama-cpp-python's low-level batch API, the
library built from the llama.cpp sources of its sdist). Per (KV type, context): max(B)
sequences are filled once by prefill (a different stretch of the text each), then for every B
the first B of them take `steps` greedy decode steps (timed: llama_decode alone, median step),
and the tokens they added are removed again. KV types: f16, q8_0, q4_0 (flash attention on, as
llama.cpp needs for quantized V); one KV stream per sequence (kv_unified off), so a token attends
over its own sequence only.

Run through bench/e2e_batched.sh, which builds llama-cpp-python (bench/llamacpp_bench.sh) and
prints this table beside ours.
  python bench/llamacpp_batched.py --model M.gguf [--batch 1,4,8] [--ctx 512,4096]
                                   [--kv f16,q8_0,q4_0] [--steps 16] [--threads 2] [--json F]
"""
import argparse
import ctypes
import json
import statistics
import time
from pathlib import Path

import llama_cpp
import numpy as np

KV_TYPES = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0, "q4_0": llama_cpp.GGML_TYPE_Q4_0}


def text_tokens(model, n):
    for p in ("/usr/share/doc/jargon-text/jargon.txt.gz", "/usr/share/common-licenses/GPL-3"):
        path = Path(p)
        if path.exists():
            if p.endswith(".gz"):
                import gzip
                text = gzip.decompress(path.read_bytes()).decode("utf-8", "replace")
            else:
                text = path.read_text()
            break
    else:
        text = " ".join(f"word{i}" for i in range(50000))
    raw = text.encode()[: 8 * n + 4096]
    buf = (llama_cpp.llama_token * (len(raw) + 16))()
    vocab = llama_cpp.llama_model_get_vocab(model)
    got = llama_cpp.llama_tokenize(vocab, raw, len(raw), buf, len(buf), True, False)
    if got < 0:
        raise SystemExit(f"tokenize failed ({got})")
    ids = list(buf[:got])
    while len(ids) < n:
        ids = ids + ids
    return ids[:n]


def decode(ctx, batch, entries):
    """entries: list of (token, pos, seq, want_logits)."""
    batch.n_tokens = len(entries)
    for i, (tok, pos, seq, want) in enumerate(entries):
        batch.token[i] = tok
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = 1 if want else 0
    rc = llama_cpp.llama_decode(ctx, batch)
    if rc != 0:
        raise RuntimeError(f"llama_decode returned {rc}")


def run(args):
    batches = [int(x) for x in args.batch.split(",")]
    ctxs = [int(x) for x in args.ctx.split(",")]
    max_b, max_ctx = max(batches), max(ctxs)
    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(args.model.encode(), mp)
    if not model:
        raise SystemExit(f"cannot load {args.model}")
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    stream = text_tokens(model, max_b * 97 + max_ctx + 8)
    rows = []
    print(f"llama.cpp (llama-cpp-python {llama_cpp.__version__}), {args.threads} threads, {args.steps} timed steps (median)")
    print("| llama.cpp KV | ctx | batch | step ms | decode tok/s (aggregate) | tok/s per sequence |")
    print("|---|---:|---:|---:|---:|---:|")
    for kv in args.kv.split(","):
        for c in ctxs:
            cp = llama_cpp.llama_context_default_params()
            cp.n_seq_max = max_b
            cp.kv_unified = args.unified
            cp.n_ctx = max_b * (c + args.steps + 16)
            cp.n_batch = 512
            cp.n_ubatch = 512
            cp.n_threads = args.threads
            cp.n_threads_batch = args.threads
            cp.type_k = KV_TYPES[kv]
            cp.type_v = KV_TYPES[kv]
            cp.flash_attn = True
            ctx = llama_cpp.llama_init_from_model(model, cp)
            if not ctx:
                raise SystemExit(f"cannot make a context for {kv} at {c}")
            batch = llama_cpp.llama_batch_init(512, 0, 1)
            for s in range(max_b):  # prefill each sequence from its own offset in the text
                toks = stream[s * 97: s * 97 + c]
                for p0 in range(0, c, 512):
                    chunk = toks[p0: p0 + 512]
                    decode(ctx, batch, [(t, p0 + i, s, False) for i, t in enumerate(chunk)])
            mem = llama_cpp.llama_get_memory(ctx)
            for b in batches:
                nxt = [stream[s * 97 + c] for s in range(b)]
                times = []
                for step in range(args.steps + 1):
                    t0 = time.perf_counter()
                    decode(ctx, batch, [(nxt[s], c + step, s, True) for s in range(b)])
                    dt = time.perf_counter() - t0
                    if step > 0:
                        times.append(dt)  # the first step warms up
                    for s in range(b):
                        lg = llama_cpp.llama_get_logits_ith(ctx, s)
                        nxt[s] = int(np.argmax(np.ctypeslib.as_array(lg, shape=(n_vocab,))))
                for s in range(b):  # back to c cached tokens
                    llama_cpp.llama_memory_seq_rm(mem, s, c, -1)
                step_s = statistics.median(times)
                row = {"kv_cache": f"llama.cpp {kv}", "ctx": c, "batch": b, "step_ms": step_s * 1e3,
                       "decode_tok_s": b / step_s, "decode_tok_s_per_seq": 1 / step_s, "threads": args.threads,
                       "steps": args.steps, "peer": "llama.cpp"}
                rows.append(row)
                print(f"| llama.cpp {kv} | {c} | {b} | {step_s * 1e3:.2f} | {b / step_s:.1f} | {1 / step_s:.1f} |", flush=True)
            llama_cpp.llama_batch_free(batch)
            llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", default="1,4,8")
    ap.add_argument("--ctx", default="512,4096")
    ap.add_argument("--kv", default="f16,q8_0,q4_0")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default="")
    ap.add_argument("--unified", action="store_true", help="one KV stream for all sequences (llama.cpp default)")
    run(ap.parse_args())


if __name__ == "__main__":
    main()
