#!/usr/bin/env python3
"""HF transformers peer of `veloxquant bench e2e --device cuda` (issue 9), timed in the same device call.

Llama-3.1-8B geometry (HF_GEO=qwen2.5-1.5b: Qwen2.5-1.5B's, with q/k/v/o biases) with random bf16
weights (built on the GPU, no files), B=1:
  decode step = (generate 65 new tokens - generate 1) / 64, prefill tok/s = ctx / generate(1 token),
with cache_implementation="static" (generate compiles the decode step into CUDA graphs) and with
the default dynamic cache (HF_MODES=static,dynamic picks). HF_PROFILE=1 also prints the top CUDA
kernels of one prefill (which SDPA backend ran) and times one causal SDPA call at the prompt's shape
with each backend. Usage: hf_peer.py [ctx ...] (default 4096 32768).
"""
import contextlib
import sys
import time

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM


# name: (hidden, intermediate, layers, heads, kv heads, vocab, RoPE base, attention bias); the RoPE
# base is also set by hand below (newer transformers keep it in rope_parameters, not rope_theta)
GEOS = {"llama-3.1-8b": (4096, 14336, 32, 32, 8, 128256, 500000.0, False),
        "qwen2.5-1.5b": (1536, 8960, 28, 12, 2, 151936, 1000000.0, True)}
GEO = __import__("os").environ.get("HF_GEO", "llama-3.1-8b")
HID, FF, LAYERS, HEADS, KV, VOCAB, THETA, BIAS = GEOS[GEO]


def build():
    cfg = LlamaConfig(hidden_size=HID, intermediate_size=FF, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                      num_key_value_heads=KV, vocab_size=VOCAB, max_position_embeddings=131072,
                      rope_theta=THETA, tie_word_embeddings=False, attention_bias=BIAS)
    with torch.device("meta"):
        m = LlamaForCausalLM(cfg)
    m = m.to_empty(device="cuda").to(torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.02, generator=g)
        for n, b in m.named_buffers():
            if "inv_freq" in n:  # recompute the rotary frequencies that to_empty left uninitialised
                d = cfg.hidden_size // cfg.num_attention_heads
                b.copy_(1.0 / (THETA ** (torch.arange(0, d, 2, device="cuda").float() / d)))
    m.eval()
    return m


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def main():
    ctxs = [int(x) for x in sys.argv[1:]] or [4096, 32768]
    print(f"torch {torch.__version__} transformers {transformers.__version__} device {torch.cuda.get_device_name(0)} "
          f"geometry {GEO}",
          flush=True)
    m = build()
    import os
    for mode in os.environ.get("HF_MODES", "static,dynamic").split(","):
        for ctx in ctxs:
            ids = torch.randint(0, VOCAB, (1, ctx), device="cuda")
            kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
            if mode == "static":
                kw["cache_implementation"] = "static"

            def gen(n):
                with torch.no_grad():
                    m.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)

            t0 = time.perf_counter()
            gen(65)  # warm-up (and compilation for the static cache)
            warm = time.perf_counter() - t0
            t1 = min(timed(lambda: gen(1)) for _ in range(2))
            t65 = min(timed(lambda: gen(65)) for _ in range(2))
            step = (t65 - t1) / 64
            print(f"hf_peer mode={mode} ctx={ctx} B=1 decode_step_ms={step * 1e3:.2f} tok_s={1 / step:.1f} "
                  f"prefill_s={t1:.3f} prefill_tok_s={ctx / t1:.0f} warmup_s={warm:.1f}", flush=True)
            if os.environ.get("HF_PROFILE"):  # which kernels the prefill ran (e.g. which SDPA backend)
                kernels(lambda: gen(1), f"mode={mode} ctx={ctx} generate(1)")
            torch.cuda.empty_cache()
        if os.environ.get("HF_PROFILE"):
            sdpa_alone(max(ctxs))


def kernels(fn, what, top=8):
    """The top CUDA kernels of one call of fn, by total device time (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    ev = [e for e in prof.key_averages() if e.device_time_total > 0]
    ev.sort(key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in ev)
    print(f"hf_peer kernels {what}: {total / 1e3:.1f} ms of device time", flush=True)
    for e in ev[:top]:
        print(f"  {e.device_time_total / 1e3:8.2f} ms {e.count:6d} x {e.key[:110]}", flush=True)


def sdpa_alone(ctx):
    """One causal SDPA call at the prompt's shape (bf16, GQA), with each backend torch has here."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    d = HID // HEADS
    q = torch.randn(1, HEADS, ctx, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, KV, ctx, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    for name, b in [("default", None), ("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                    ("efficient", SDPBackend.EFFICIENT_ATTENTION)]:
        def call():
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        try:
            with sdpa_kernel([b]) if b is not None else contextlib.nullcontext():
                call()
                t = min(timed(call) for _ in range(3))
            print(f"hf_peer sdpa ctx={ctx} backend={name} ms={t * 1e3:.2f} per layer", flush=True)
        except RuntimeError as e:
            print(f"hf_peer sdpa ctx={ctx} backend={name} unavailable: {str(e).splitlines()[0][:100]}", flush=True)


if __name__ == "__main__":
    main()
