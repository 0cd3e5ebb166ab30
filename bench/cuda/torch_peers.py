#!/usr/bin/env python3
"""PyTorch peers for bench_cuda_ops, timed in the same run on the same shapes (bench/cuda/run_all.sh).

(a) quantize, nearest of 256 centroids on fp16 inputs: "chunked" (difference tensor + sum +
    argmin in chunks of 4096, the original's pure-framework path) and "matmul" (|c|^2 - 2 x.c,
    argmin). Scratch = peak device memory above inputs/outputs.
(b) decode attention, Llama-3.1-8B geometry (Hq=32, Hkv=8, D=128): SDPA on fp16 K/V
    (enable_gqa) and dequantise-then-SDPA (d4b8 codes gathered through a 256x4 codebook).
Medians of CUDA-event timings after warm-up; inputs rotated over copies up to ~512 MiB.
"""
import os
import sys

import torch
import torch.nn.functional as F


def median_ms(fn, reps=15, warm=3, batch=1):
    for i in range(warm):
        fn(i)
    torch.cuda.synchronize()
    times = []
    for r in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        for j in range(batch):
            fn(r * batch + j)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / batch)
    times.sort()
    return times[len(times) // 2]


def warm_gpu(ms=300):
    """Busy the GPU for ~ms before timing: an idle H200 sits at ~345 MHz and the first shapes of a
    table were measured while the clock ramped (SDPA B=1 S=4K: 0.0494 ms in run 37 against 0.0256)."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    while True:
        for _ in range(20):
            a @ a
        e1.record()
        e1.synchronize()
        if e0.elapsed_time(e1) >= ms:
            break
    del a


def copy_bw():
    n = 2 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(1)
    b = torch.empty_like(a)
    ms = median_ms(lambda i: b.copy_(a), reps=9)
    print(f"torch_copy bytes={n} ms={ms:.4f} GBps_rw={2 * n / (ms * 1e-3) / 1e9:.0f}", flush=True)
    del a, b


def quant_chunked(x, c, out, chunk=4096):
    for i in range(0, x.shape[0], chunk):
        diff = x[i:i + chunk, None, :] - c[None, :, :]
        out[i:i + chunk] = (diff * diff).sum(-1).argmin(-1)


def quant_matmul(x, c, out):
    cn = (c.float() * c.float()).sum(-1)
    d = cn[None, :] - 2.0 * (x @ c.t()).float()
    out.copy_(d.argmin(-1))


def peak_scratch(fn):
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn(0)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def bench_quant():
    g = torch.Generator(device="cuda").manual_seed(0)
    for S, D, H, sub in [(128, 128, 8, 8), (512, 128, 8, 8), (2048, 128, 8, 8), (8192, 128, 8, 8),
                         (1024, 256, 4, 4), (4096, 256, 4, 4)]:
        N = H * S * D // sub
        x = torch.randn(N, sub, device="cuda", dtype=torch.float16, generator=g)
        c = torch.randn(256, sub, device="cuda", dtype=torch.float16, generator=g)
        out = torch.empty(N, dtype=torch.int64, device="cuda")
        ch = lambda i: quant_chunked(x, c, out)
        mm = lambda i: quant_matmul(x, c, out)
        s_ch, s_mm = peak_scratch(ch), peak_scratch(mm)
        t_ch = median_ms(ch, reps=7 if N > 300000 else 15)
        t_mm = median_ms(mm)
        print(f"torch_quant S={S} D={D} H={H} sub={sub} N={N} chunked_ms={t_ch:.4f} chunked_scratch_MiB={s_ch:.0f} "
              f"matmul_ms={t_mm:.4f} matmul_scratch_MiB={s_mm:.0f}", flush=True)
        del x, c, out
        torch.cuda.empty_cache()


def bench_attn():
    B_list, S_list = [1, 8], [4096, 32768, 131072]
    Hq, Hkv, D = 32, 8, 128
    g = torch.Generator(device="cuda").manual_seed(1)
    for B in B_list:
        for S in S_list:
            kv_bytes = 2 * B * Hkv * S * D * 2
            copies = max(1, min(32, (512 << 20) // kv_bytes))
            q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.float16, generator=g)
            ks = [torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.float16, generator=g) for _ in range(copies)]
            vs = [torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.float16, generator=g) for _ in range(copies)]
            sdpa = lambda i: F.scaled_dot_product_attention(q, ks[i % copies], vs[i % copies], enable_gqa=True)
            t_sdpa = median_ms(sdpa, reps=21, batch=10)
            del ks, vs
            torch.cuda.empty_cache()
            # Dequantise-then-SDPA: 32 sub-vectors of 4 per key/value row, one 256x4 codebook each side.
            code_bytes = 2 * B * Hkv * S * (D // 4)
            ccopies = max(1, min(32, (512 << 20) // code_bytes))
            kc = [torch.randint(0, 256, (B, Hkv, S, D // 4), device="cuda", dtype=torch.uint8, generator=g)
                  for _ in range(ccopies)]
            vc = [torch.randint(0, 256, (B, Hkv, S, D // 4), device="cuda", dtype=torch.uint8, generator=g)
                  for _ in range(ccopies)]
            kb = torch.randn(256, 4, device="cuda", dtype=torch.float16, generator=g)
            vb = torch.randn(256, 4, device="cuda", dtype=torch.float16, generator=g)

            def deq(i):
                K = kb[kc[i % ccopies].long()].reshape(B, Hkv, S, D)
                V = vb[vc[i % ccopies].long()].reshape(B, Hkv, S, D)
                return F.scaled_dot_product_attention(q, K, V, enable_gqa=True)

            t_deq = median_ms(deq, reps=11, batch=2)
            print(f"torch_attn B={B} Hq={Hq} Hkv={Hkv} D={D} S={S} sdpa_fp16_ms={t_sdpa:.4f} "
                  f"sdpa_GBps={kv_bytes / (t_sdpa * 1e-3) / 1e9:.0f} dequant_sdpa_ms={t_deq:.4f} "
                  f"rotate_copies={copies}", flush=True)
            del kc, vc
            torch.cuda.empty_cache()


def bench_attn10():
    """Issue 10's table: Llama-3.1-8B (32/8, D=128) and Falcon3-7B (12/4, D=256) geometries, B in
    {1, 8, 32}, S in {4k, 32k, 128k}; SDPA on fp16 K/V and dequantise-then-SDPA (d4b8 codes through
    one 256x4 book per side); shapes whose fp16 K/V exceed 40 GB skipped. Then the prefill peer: a
    512-query chunk against 32k cached tokens (flash SDPA on fp16, and dequantise-then-SDPA)."""
    g = torch.Generator(device="cuda").manual_seed(1)
    only = os.environ.get("VQ_PEER_GEO", "")  # e.g. "falcon": that geometry alone, no prefill peer
    for name, Hq, Hkv, D in [("llama-3.1-8b", 32, 8, 128), ("falcon3-7b", 12, 4, 256)]:
        if only and only not in name:
            continue
        for B in [1, 8, 32]:
            for S in [4096, 32768, 131072]:
                kv_bytes = 2 * B * Hkv * S * D * 2
                if kv_bytes > 40e9:
                    print(f"torch_attn10 geo={name} B={B} S={S} skipped (fp16 K/V {kv_bytes / 1e9:.0f} GB)", flush=True)
                    continue
                copies = max(1, min(8, (512 << 20) // kv_bytes))
                q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.float16, generator=g)
                ks = [torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.float16, generator=g) for _ in range(copies)]
                vs = [torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.float16, generator=g) for _ in range(copies)]
                sdpa = lambda i: F.scaled_dot_product_attention(q, ks[i % copies], vs[i % copies], enable_gqa=True)
                t_sdpa = median_ms(sdpa, reps=15, batch=4)
                del ks, vs
                torch.cuda.empty_cache()
                kc = torch.randint(0, 256, (B, Hkv, S, D // 4), device="cuda", dtype=torch.uint8, generator=g)
                vc = torch.randint(0, 256, (B, Hkv, S, D // 4), device="cuda", dtype=torch.uint8, generator=g)
                kb = torch.randn(256, 4, device="cuda", dtype=torch.float16, generator=g)
                vb = torch.randn(256, 4, device="cuda", dtype=torch.float16, generator=g)

                def deq(i):
                    K = kb[kc.long()].reshape(B, Hkv, S, D)
                    V = vb[vc.long()].reshape(B, Hkv, S, D)
                    return F.scaled_dot_product_attention(q, K, V, enable_gqa=True)

                try:
                    t_deq = median_ms(deq, reps=7, batch=1)
                except torch.OutOfMemoryError:
                    t_deq = float("nan")
                print(f"torch_attn10 geo={name} B={B} S={S} sdpa_fp16_ms={t_sdpa:.4f} "
                      f"sdpa_GBps={kv_bytes / (t_sdpa * 1e-3) / 1e9:.0f} dequant_sdpa_ms={t_deq:.4f}", flush=True)
                del kc, vc
                torch.cuda.empty_cache()
    if only:
        return
    bench_prefill(g)


SWEEP_GEOS = [("llama-3.1-8b", 32, 8, 128), ("qwen2.5-7b", 28, 4, 128), ("qwen2.5-1.5b", 12, 2, 128),
              ("70b-tp8", 8, 1, 128), ("qwen2.5-0.5b", 14, 2, 64), ("smollm2", 9, 3, 64),
              ("gemma2-9b", 16, 8, 256), ("falcon3-7b", 12, 4, 256)]


def bench_sweep():
    """Issue 20's sweep (bench_paged_attention --sweep's shapes): SDPA on fp16 K/V (enable_gqa,
    4 calls per event pair) and dequantise-then-SDPA (d4b8 codes through one 256x4 book per side,
    where its fp16 copy fits beside the codes); shapes whose fp16 K/V exceed 56 GB skipped.
    VQ_PEER_GEO=name: that geometry alone."""
    g = torch.Generator(device="cuda").manual_seed(1)
    only = os.environ.get("VQ_PEER_GEO", "")
    deq_on = os.environ.get("VQ_PEER_DEQUANT", "1") != "0"
    for name, Hq, Hkv, D in SWEEP_GEOS:
        if only and only not in name:
            continue
        for B in [1, 4, 16, 64]:
            for S in [4096, 16384, 65536, 204800]:
                kv_bytes = 2 * B * Hkv * S * D * 2
                if kv_bytes > 56e9:
                    print(f"torch_sweep geo={name} B={B} S={S} skipped (fp16 K/V {kv_bytes / 1e9:.0f} GB)", flush=True)
                    continue
                copies = max(1, min(8, (512 << 20) // kv_bytes))
                q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.float16, generator=g)
                ks = [torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.float16, generator=g) for _ in range(copies)]
                vs = [torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.float16, generator=g) for _ in range(copies)]
                sdpa = lambda i: F.scaled_dot_product_attention(q, ks[i % copies], vs[i % copies], enable_gqa=True)
                t_sdpa = median_ms(sdpa, reps=15 if kv_bytes < 8e9 else 7, batch=4)
                del ks, vs
                torch.cuda.empty_cache()
                t_deq = float("nan")
                if deq_on and kv_bytes <= 24e9:
                    kc = torch.randint(0, 256, (B, Hkv, S, D // 4), device="cuda", dtype=torch.uint8, generator=g)
                    vc = torch.randint(0, 256, (B, Hkv, S, D // 4), device="cuda", dtype=torch.uint8, generator=g)
                    kb = torch.randn(256, 4, device="cuda", dtype=torch.float16, generator=g)
                    vb = torch.randn(256, 4, device="cuda", dtype=torch.float16, generator=g)

                    def deq(i):
                        K = kb[kc.long()].reshape(B, Hkv, S, D)
                        V = vb[vc.long()].reshape(B, Hkv, S, D)
                        return F.scaled_dot_product_attention(q, K, V, enable_gqa=True)

                    try:
                        t_deq = median_ms(deq, reps=5, warm=1, batch=1)
                    except torch.OutOfMemoryError:
                        pass
                    del kc, vc
                    torch.cuda.empty_cache()
                print(f"torch_sweep geo={name} B={B} S={S} sdpa_fp16_ms={t_sdpa:.4f} "
                      f"sdpa_GBps={kv_bytes / (t_sdpa * 1e-3) / 1e9:.0f} dequant_sdpa_ms={t_deq:.4f}", flush=True)


def bench_prefill(g=None):
    """Prefill peer: a 512-query chunk against 32k cached tokens, Llama geometry: SDPA on fp16 as
    torch picks it ("flash_fp16"), each backend of it forced in turn, and dequantise-then-SDPA."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    g = g or torch.Generator(device="cuda").manual_seed(1)
    Hq, Hkv, D, S, Q = 32, 8, 128, 32768, 512
    q = torch.randn(1, Hq, Q, D, device="cuda", dtype=torch.float16, generator=g)
    K = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.float16, generator=g)
    V = torch.randn(1, Hkv, S, D, device="cuda", dtype=torch.float16, generator=g)
    t_fl = median_ms(lambda i: F.scaled_dot_product_attention(q, K, V, enable_gqa=True), reps=15)
    flop = 4.0 * Q * S * D * Hq
    for name in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION"):
        try:
            with sdpa_kernel(getattr(SDPBackend, name)):
                t = median_ms(lambda i: F.scaled_dot_product_attention(q, K, V, enable_gqa=True), reps=15)
            print(f"torch_prefill_backend {name} ms={t:.4f} TFLOPs={flop / (t * 1e-3) / 1e12:.1f}", flush=True)
        except Exception as e:  # a backend that does not take this shape
            print(f"torch_prefill_backend {name} unavailable: {str(e).splitlines()[0][:120]}", flush=True)
    kc = torch.randint(0, 256, (1, Hkv, S, D // 4), device="cuda", dtype=torch.uint8, generator=g)
    vc = torch.randint(0, 256, (1, Hkv, S, D // 4), device="cuda", dtype=torch.uint8, generator=g)
    kb = torch.randn(256, 4, device="cuda", dtype=torch.float16, generator=g)
    vb = torch.randn(256, 4, device="cuda", dtype=torch.float16, generator=g)
    t_dq = median_ms(lambda i: F.scaled_dot_product_attention(q, kb[kc.long()].reshape(1, Hkv, S, D),
                                                              vb[vc.long()].reshape(1, Hkv, S, D), enable_gqa=True),
                     reps=9)
    print(f"torch_prefill_attn Q={Q} S={S} Hq={Hq} Hkv={Hkv} D={D} flash_fp16_ms={t_fl:.4f} "
          f"TFLOPs={flop / (t_fl * 1e-3) / 1e12:.1f} dequant_flash_ms={t_dq:.4f}", flush=True)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    print(f"torch {torch.__version__} cuda {torch.version.cuda} device {torch.cuda.get_device_name(0)}", flush=True)
    warm_gpu()
    if what in ("all", "copy"):
        copy_bw()
    if what in ("all", "quant"):
        bench_quant()
    if what in ("all", "attn"):
        bench_attn()
    if what == "attn10":
        bench_attn10()
    if what == "sweep":
        bench_sweep()
    if what == "prefill":
        bench_prefill()
