"""Decode speed, KV memory and KL of transformers caches on one GPU: fp16 (DynamicCache + SDPA,
StaticCache), HF QuantizedCache (quanto / HQQ, 2 and 4 bits) and veloxquant.torch; a method
suffixed "+c" runs its decode steps through torch.compile (mode reduce-overhead; "+cd": the default
mode, no CUDA graphs; "+cg": reduce-overhead with veloxquant's cache sized up front, max_batch_size
and max_cache_len as StaticCache's, and graph_decode=True, so that its attention runs inside the
CUDA graphs, coded methods included), e.g. static+c
(HF's static compiled cache) beside vq:vecinfer:d4b8+c. "nokv" (no cache at all: each decode step
attends over its own token only) is the floor of any cache's step: the weights and everything but
reading the past, e.g. nokv+c beside static+c.

    python bench/torch_cache_bench.py --geometry llama-3.1-8b --ctx 4096,32768 --batch 1,8 \
        --methods fp16,static+c,quanto4,quanto2,hqq4,hqq2,vq:vecinfer:d4b8,vq:vecinfer:d4b8+c --steps 16 --budget-s 400

Random weights at the named shape (fp16), or --gguf FILE (a real model loaded by transformers
from its GGUF; needs the gguf package). Each (method, batch, context): prefill of ctx tokens per
row (random tokens; logits of the last position only), then --steps greedy decode steps timed
with CUDA events after one warm-up step; tok/s = batch * steps / time. KV bytes: torch's peak
allocated memory over the weights (HF caches) or the pool's bytes (veloxquant's cudaMalloc'd
blocks, which torch does not see), and the fp16 bytes the same tokens take. --kl-text FILE: KL of
each method's next-token distributions against fp16's over the text (teacher-forced decode).
Every case runs under the --budget-s deadline; a case that fails or does not fit says so in
the table. Output: one JSON line per case on stdout and a table at the end.
"""
import argparse
import gc
import json
import math
import os
import signal
import sys
import time

import torch

GEOMETRIES = {
    # hidden, layers, heads, kv heads, head_dim, intermediate, vocab, rope theta
    "llama-3.1-8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         head_dim=128, intermediate_size=14336, vocab_size=128256, rope_theta=500000.0),
    # Qwen2.5(-Coder)-1.5B: the Qwen2 architecture (q/k/v bias), 6 query heads per KV head, tied embeddings
    "qwen2.5-1.5b": dict(arch="qwen2", hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, head_dim=128, intermediate_size=8960, vocab_size=151936,
                         rope_theta=1000000.0, tie_word_embeddings=True),
    "tiny": dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                 intermediate_size=1024, vocab_size=1000, rope_theta=10000.0),
}


def load_vqt():
    try:
        import veloxquant.torch as vqt
        return vqt
    except ImportError:
        import importlib.util
        here = os.path.dirname(os.path.abspath(__file__))
        p = os.environ.get("VQ_TORCH_PY") or os.path.join(here, "..", "python", "veloxquant", "torch.py")
        spec = importlib.util.spec_from_file_location("veloxquant_torch", p)
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)
        return m


def make_model(args):
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    if args.gguf:
        d, f = os.path.split(args.gguf)
        m = AutoModelForCausalLM.from_pretrained(d or ".", gguf_file=f,
                                                 dtype=torch.float16 if DEV == "cuda" else torch.float32)
        return m.to(DEV).eval()
    geo = dict(GEOMETRIES[args.geometry])
    qwen2 = geo.pop("arch", "llama") == "qwen2"
    cfg = (Qwen2Config if qwen2 else LlamaConfig)(max_position_embeddings=131072, **geo)
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float16 if DEV == "cuda" else torch.float32)
    with torch.device(DEV):
        m = (Qwen2ForCausalLM if qwen2 else LlamaForCausalLM)(cfg)
    torch.set_default_dtype(old)
    with torch.no_grad():  # random weights of a realistic scale (transformers' init is slow on 8B)
        for p in m.parameters():
            p.normal_(0.0, 0.02)
    return m.eval()


def make_cache(name, model, vqt, calib, sized=None):
    from transformers import DynamicCache, QuantizedCache, StaticCache
    if name == "fp16":
        model.set_attn_implementation("sdpa")
        return DynamicCache(config=model.config)
    if name.startswith("quanto") or name.startswith("hqq"):
        model.set_attn_implementation("sdpa")
        backend = "quanto" if name.startswith("quanto") else "hqq"
        bits = int(name[len(backend):])
        return QuantizedCache(backend=backend, config=model.config, nbits=bits,
                              axis_key=0 if backend == "quanto" else 1, axis_value=0 if backend == "quanto" else 1)
    if name.startswith("vq:"):
        spec = name[3:]
        b, n = sized if sized else (None, None)
        return vqt.cache(model, spec, calib=calib if "vecinfer" in spec else None, gguf_channel_order=GGUF_ORDER,
                         max_batch_size=b, max_cache_len=n, graph_decode=True if sized else None)
    raise ValueError(name)


def kv_fp16_bytes(model, tokens):
    c = model.config
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return 2 * c.num_hidden_layers * c.num_key_value_heads * hd * 2 * tokens


DEV = "cuda"
GGUF_ORDER = False  # --gguf-channel-order


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


_COMPILE_MODES = {"+c": "reduce-overhead", "+cd": "default", "+cg": "reduce-overhead"}


def split_method(method):
    """"vq:vecinfer:d4b8+c" -> ("vq:vecinfer:d4b8", "reduce-overhead"); no suffix: (method, None)."""
    base, plus, suffix = method.rpartition("+")
    mode = _COMPILE_MODES.get(plus + suffix) if plus else None
    return (base, mode) if mode else (method, None)


def compiled_forward(model, mode="reduce-overhead"):
    """A fresh torch.compile'd forward: each case compiles afresh, so an earlier case's CUDA-graph
    pools (or a failure inside their recording, e.g. out of memory) do not carry into it."""
    torch._dynamo.reset()
    return torch.compile(model.forward, mode=mode, fullgraph=True)


@torch.no_grad()
def run_case(model, vqt, method, B, ctx, steps, calib, chunk=4096):
    sync()
    gc.collect()
    cuda = DEV == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if cuda else 0
    free0 = torch.cuda.mem_get_info()[0] if cuda else 0
    V = model.config.vocab_size
    ids = torch.randint(0, V, (B, ctx), device=DEV)
    r = {"method": method, "batch": B, "ctx": ctx}
    # "<method>+c": the decode steps through torch.compile (mode reduce-overhead: CUDA graphs; the
    # veloxquant op is tagged cudagraph-unsafe, so its graphs are split around it); prefill eager
    # "<method>+cd": compiled in torch.compile's default mode (no CUDA graphs: every kernel launched)
    sized = (B, ctx + steps + 8) if method.endswith("+cg") else None  # 3 warm-up steps + the timed ones
    method, mode = split_method(method)
    compiled = mode is not None
    if method == "static":
        from transformers import StaticCache
        model.set_attn_implementation("sdpa")
        cache = StaticCache(config=model.config, max_cache_len=ctx + steps + 8)  # 3 compiled warm-up steps + the timed ones
    elif method == "nokv":  # the step's floor: no past to read (no prefill either)
        model.set_attn_implementation("sdpa")
        cache = None
    else:
        cache = make_cache(method, model, vqt, calib, sized)
    t0 = time.time()
    out = None
    nxt = ids[:, -1:]
    for i in range(0, ctx if cache is not None else 0, chunk):  # chunked prefill: every cache takes it, and memory stays bounded
        cp = torch.arange(i, min(ctx, i + chunk), device=DEV) if method == "static" else None
        out = model(ids[:, i:i + chunk], past_key_values=cache, use_cache=True, logits_to_keep=1, cache_position=cp)
    if out is not None:
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    sync()
    r["prefill_s"] = round(time.time() - t0, 3)
    pos = ctx

    fwd = compiled_forward(model, mode) if compiled else model

    def step(tok, pos):
        cp = torch.tensor([pos], device=DEV)
        o = fwd(input_ids=tok, past_key_values=cache, use_cache=cache is not None,
                cache_position=cp if method in ("static", "nokv") or compiled else None)
        return o.logits[:, -1].argmax(-1, keepdim=True)

    t2 = time.time()
    for _ in range(3 if compiled else 1):  # warm-up (compiled: trace, CUDA-graph warm-up, record)
        nxt = step(nxt, pos)
        pos += 1
    sync()
    if compiled:
        r["compile_s"] = round(time.time() - t2, 1)
    sync()
    t1 = time.time()
    if cuda:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
    for _ in range(steps):
        nxt = step(nxt, pos)
        pos += 1
    if cuda:
        e1.record()
    sync()
    ms = (e0.elapsed_time(e1) if cuda else (time.time() - t1) * 1000.0) / steps
    r["step_ms"] = round(ms, 3)
    r["tok_s"] = round(B * 1000.0 / ms, 1)
    r["peak_torch_gib"] = round((torch.cuda.max_memory_allocated() - base) / 2**30, 3) if cuda else 0
    if method.startswith("vq:"):
        mem = cache.memory()
        r["kv_gib"] = round(mem["pool"] / 2**30, 3)
        r["device_used_gib"] = round((free0 - torch.cuda.mem_get_info()[0]) / 2**30, 3) if cuda else 0
    r["kv_fp16_gib"] = round(kv_fp16_bytes(model, B * pos) / 2**30, 3)
    del cache, out
    return r


@torch.no_grad()
def kl_case(model, vqt, method, ids, calib, ref=None, n0=1):
    """Log-probs of positions n0-1 .. n-2: a prefill of n0 tokens, then teacher-forced decode (every
    cache, HF's quantized ones too, then reads what it stored; n0 = 1 scores the positions that
    `veloxquant perplexity` scores in one window)."""
    cache = make_cache(method, model, vqt, calib) if method != "static" else None
    if n0 <= 0:  # one forward over the text: exact for fp16 and veloxquant (their prefill reads what they store)
        out = model(ids, past_key_values=cache, use_cache=True)
        lp = torch.log_softmax(out.logits[0, :-1].float(), -1)
        return lp, (None if ref is None else (ref.exp() * (ref - lp)).sum(-1).mean().item())
    out = model(ids[:, :n0], past_key_values=cache, use_cache=True, logits_to_keep=1)
    lps = [torch.log_softmax(out.logits[:, -1].float(), -1)]
    for t in range(n0, ids.shape[1] - 1):
        o = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
        lps.append(torch.log_softmax(o.logits[:, -1].float(), -1))
    lp = torch.cat(lps)
    if ref is None:
        return lp, None
    kl = (ref.exp() * (ref - lp)).sum(-1).mean().item()
    return lp, kl


class CaseTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise CaseTimeout("stopped: past --case-s")


def main():
    signal.signal(signal.SIGALRM, _alarm)
    ap = argparse.ArgumentParser()
    ap.add_argument("--geometry", default="llama-3.1-8b", choices=sorted(GEOMETRIES))
    ap.add_argument("--gguf", default="")
    ap.add_argument("--ctx", default="4096,32768")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--methods", default="fp16,static,quanto4,quanto2,hqq4,hqq2,vq:vecinfer:d4b8,vq:fp16")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--calib", default="", help="VecInfer calibration (default: random codebooks, speed only)")
    ap.add_argument("--kl-text", default="", help="token ids file (one int per whitespace) or text (with --gguf)")
    ap.add_argument("--kl-tokens", type=int, default=1024)
    ap.add_argument("--kl-prefill", type=int, default=1, help="tokens prefilled before the teacher-forced decode; 0: one forward over the whole text (exact only for "
                         "fp16 and veloxquant caches, whose prefill reads what they store; not for HF's quantized ones)")
    ap.add_argument("--budget-s", type=float, default=1e9)
    ap.add_argument("--out", default="")
    ap.add_argument("--case-s", type=float, default=120, help="a case running longer is stopped (SIGALRM)")
    ap.add_argument("--chunk", type=int, default=4096, help="prefill chunk (tokens per row per forward)")
    ap.add_argument("--gguf-channel-order", action="store_true",
                    help="--calib was written by `veloxquant calibrate` on a llama-family GGUF (veloxquant.torch.cache)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a smoke test of the script")
    args = ap.parse_args()
    global DEV, GGUF_ORDER
    DEV = args.device
    GGUF_ORDER = args.gguf_channel_order
    deadline = time.time() + args.budget_s
    vqt = load_vqt()
    name = torch.cuda.get_device_name() if DEV == "cuda" else "cpu"
    print(f"# {name} torch {torch.__version__} python {sys.version.split()[0]}", flush=True)
    model = make_model(args)
    calib = args.calib
    if not calib and any("vecinfer" in m for m in args.methods.split(",")):
        c = model.config
        hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        spec = [split_method(m)[0][3:] for m in args.methods.split(",") if "vecinfer" in m][0]
        calib = vqt.random_calibration(spec, c.num_hidden_layers, c.num_key_value_heads, hd, "/tmp/bench_random.vqcal")
    rows = []
    for ctx in [int(x) for x in args.ctx.split(",") if x and x != "none"]:
        for B in [int(x) for x in args.batch.split(",")]:
            for method in args.methods.split(","):
                if time.time() > deadline:
                    r = {"method": method, "batch": B, "ctx": ctx, "error": "not run: past the time budget"}
                else:
                    signal.alarm(int(args.case_s))
                    try:
                        r = run_case(model, vqt, method, B, ctx, args.steps, calib, args.chunk)
                    except BaseException as e:  # noqa: BLE001 - the table says what failed
                        r = {"method": method, "batch": B, "ctx": ctx, "error": f"{type(e).__name__}: {e}"[:300]}
                    finally:
                        signal.alarm(0)
                    gc.collect()
                    if DEV == "cuda":
                        torch.cuda.empty_cache()
                print(json.dumps(r), flush=True)
                rows.append(r)
    if args.kl_text and time.time() < deadline:
        txt = open(args.kl_text).read()
        try:
            ids = torch.tensor([[int(w) for w in txt.split()]])
        except ValueError:
            from transformers import AutoTokenizer
            d, f = os.path.split(args.gguf)
            tok = AutoTokenizer.from_pretrained(d or ".", gguf_file=f)
            ids = tok(txt, return_tensors="pt").input_ids
        ids = ids[:, :args.kl_tokens].to(DEV)
        ref, _ = kl_case(model, vqt, "fp16", ids, calib, n0=args.kl_prefill)
        for method in args.methods.split(","):
            if method in ("fp16", "static") or split_method(method)[1] or time.time() > deadline:
                continue
            try:
                _, kl = kl_case(model, vqt, method, ids, calib, ref, n0=args.kl_prefill)
                r = {"method": method, "kl_vs_fp16": round(kl, 5), "kl_tokens": int(ids.shape[1])}
            except Exception as e:  # noqa: BLE001
                r = {"method": method, "kl_error": f"{type(e).__name__}: {e}"[:300]}
            print(json.dumps(r), flush=True)
            rows.append(r)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    print("\n| method | B | ctx | tok/s | step ms | KV GiB (fp16 GiB) | prefill s | note |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "ctx" not in r:
            continue
        kv = r.get("kv_gib", r.get("peak_torch_gib", ""))
        print(f"| {r['method']} | {r['batch']} | {r['ctx']} | {r.get('tok_s', '')} | {r.get('step_ms', '')} | "
              f"{kv} ({r.get('kv_fp16_gib', '')}) | {r.get('prefill_s', '')} | {r.get('error', '')[:80]} |")


if __name__ == "__main__":
    main()
