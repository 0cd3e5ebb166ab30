"""cuBLAS fp16 products of a Llama-3.1-8B layer (q/k/v, o, gate+up, down) at 8..264 activation rows
(torch's F.linear on random weights, CUDA events, 50 calls after 5): how the weight stream's rate
changes from decode rows to a decode batch with a prefill chunk beside it (issue 21's ITL floor).
    python3 bench/cuda/gemm_rows_probe.py     (on the device machine; torch with CUDA)"""
import torch, torch.nn.functional as F
torch.manual_seed(0)
shapes = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
W = {k: torch.randn(n, k_, device="cuda", dtype=torch.float16) * 0.02 for k, (n, k_) in shapes.items()}
def t(fn, reps=50):
    for _ in range(5): fn()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(); e0.record()
    for _ in range(reps): fn()
    e1.record(); torch.cuda.synchronize()
    return e0.elapsed_time(e1) / reps * 1000
for M in (8, 16, 40, 72, 136, 264):
    tot = 0; cells = []
    for k, w in W.items():
        x = torch.randn(M, w.shape[1], device="cuda", dtype=torch.float16)
        us = t(lambda: F.linear(x, w)); tot += us
        gbs = w.numel() * 2 / (us * 1e-6) / 1e9
        cells.append(f"{k} {us:.1f}us {gbs:.0f}GB/s")
    print(f"M={M:4d} layer {tot:.0f} us x32 = {tot*32/1000:.2f} ms | " + " | ".join(cells), flush=True)
