"""veloxquant.torch: a transformers model generating with VeloxQuant's compressed KV cache.

    pip install .            # the package (libveloxquant_torch.so with it); CUDA: add
                             #   -Ccmake.define.VQ_ENABLE_CUDA=ON where nvcc is
    pip install torch "transformers>=5"
    python examples/torch_generate.py MODEL_DIR_OR_GGUF [spec]

MODEL_DIR_OR_GGUF: a Hugging Face model directory (llama / qwen2 / qwen3 / mistral), or a GGUF
file (transformers loads it; needs `pip install gguf`). The spec defaults to vecinfer:d4b8; its
calibration is recorded from the model on this script's own text the first time (calibrate()),
the same file `veloxquant calibrate` writes.
"""
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import veloxquant.torch as vqt

path = sys.argv[1]
spec = sys.argv[2] if len(sys.argv) > 2 else "vecinfer:d4b8"
kw = {}
if path.endswith(".gguf"):
    kw["gguf_file"] = os.path.basename(path)
    path = os.path.dirname(path) or "."
device = "cuda" if torch.cuda.is_available() and vqt.cuda_available() else "cpu"
dtype = torch.float16 if device == "cuda" else torch.float32
tok = AutoTokenizer.from_pretrained(path, **kw)
tok.padding_side = "left"  # the cache takes left padding (pads never enter the pool)
if tok.pad_token is None:
    tok.pad_token = tok.eos_token
model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kw).to(device).eval()

calib = None
if spec.startswith("vecinfer"):
    calib = "example_" + spec.replace(":", "_") + ".vqcal"
    if not os.path.exists(calib):  # any text of the model's domain; more tokens, better codebooks
        vqt.calibrate(model, tok, open(__file__).read() * 8, spec, calib, max_tokens=2048)

inputs = tok(["The sky is blue because", "Write a haiku about the sea."], return_tensors="pt", padding=True).to(device)

# The two-line change: a VeloxQuant cache instead of the default one.
cache = vqt.cache(model, spec, calib=calib)
out = model.generate(**inputs, past_key_values=cache, max_new_tokens=48, do_sample=False)

for row in tok.batch_decode(out[:, inputs.input_ids.shape[1]:], skip_special_tokens=True):
    print("->", row.strip())
mem = cache.memory()
print(f"{cache.spec} on {cache.device_kind}: KV {mem['tokens'] / 2**20:.2f} MiB "
      f"(fp16 would take {mem['fp16'] / 2**20:.2f} MiB)")
