"""Where a sized cache's coded decode departs from the unsized eager one on the GPU (issue 23, CUDA_NOTES
9a): the same tiny model, prompts and teacher-forced tokens as python/tests/test_torch.py's
test_sized_cache_decodes_in_cuda_graphs, run eager, compiled without CUDA graphs and compiled with
them, for the sized cache (graph_decode=True) and the unsized one; prints each run's largest logit
difference from the unsized eager run, the first step past 0.05 and the top-1 agreement.
    PYTHONPATH=<dir with veloxquant/torch.py> VQ_TORCH_LIB=... python3 bench/cuda/diag_sized.py
"""
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "tests"))
import veloxquant.torch as vqt  # noqa: E402
from test_torch import _Tok, _turns, tiny  # noqa: E402

m0 = tiny("llama", "cpu", layers=1)


def calibrate(spec):
    """A calibration file of the spec (its own granularity) from the tiny model."""
    return vqt.calibrate(m0, _Tok(), " ".join(str(i % 300) for i in range(4096)), spec,
                         os.path.join(tempfile.mkdtemp(), "t.vqcal"), max_tokens=2048, segment_tokens=1024,
                         model_name="tiny.gguf")


m = tiny("llama", "cuda", layers=1)
g = torch.Generator().manual_seed(5)
P = [torch.randint(0, 320, (2, n), generator=g).cuda() for n in (37, 21)]
T = [[torch.randint(0, 320, (2, 1), generator=g).cuda() for _ in range(40)] for _ in P]
for spec in ("vecinfer:d4b8", "vecinfer:d4b8,gran=shared", "fp16"):
    c = calibrate(spec) if spec != "fp16" else None
    ref = _turns(m, m, vqt.cache(m, spec, calib=c), P, T)
    for name, mode in (("eager", None), ("compiled-default", "default"), ("compiled-graphs", "reduce-overhead")):
        torch._dynamo.reset()
        fwd = m if mode is None else torch.compile(m.forward, mode=mode, fullgraph=True)
        for sized in (False, True):
            kw = dict(max_batch_size=2, max_cache_len=160, graph_decode=True) if sized else {}
            try:
                got = _turns(fwd, m, vqt.cache(m, spec, calib=c, **kw), P, T)
            except Exception as e:  # noqa: BLE001  (one case's failure must not hide the others)
                import traceback
                tb = traceback.extract_tb(e.__traceback__)
                print(f"{spec:28s} {name:17s} sized={sized!s:5s} FAILED {type(e).__name__}: {str(e)[:200]} at "
                      + " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno}" for f in tb[-6:]), flush=True)
                continue
            d = (got - ref).abs().amax(dim=(1, 2))
            bad = (d > 0.05).nonzero()
            agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
            print(f"{spec:28s} {name:17s} sized={sized!s:5s} max {d.max().item():.4f} median {d.median().item():.4f} "
                  f"first step > 0.05: {int(bad[0]) if len(bad) else -1:3d} top-1 agree {agree:.3f}", flush=True)
