"""Checks the rotary-pair convention of a GGUF empirically (run by hand, not a test):
    .venv/bin/python -m tests.reference.check_rope MODEL.gguf
Encodes an English text with the `tokenizers` package (a byte-level BPE built from the GGUF's
vocabulary and merges, gpt2-style models only), then prints the mean next-token negative
log-likelihood of the NumPy forward with both rope layouts. The layout the model was trained
with gives a far lower loss (SmolLM2, "llama": adjacent pairs); the other one scrambles
positions and the loss jumps.
"""
import sys

import numpy as np
from gguf import GGUFReader
from tokenizers import Tokenizer, models, pre_tokenizers, decoders

from .numpy_forward import NumpyModel, _field

TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes "
        "Gutenberg combined movable metal type, oil-based ink and a wooden screw press. Books "
        "became cheaper, literacy spread, and ideas travelled faster across Europe than ever before.")


def bpe_from_gguf(path: str) -> Tokenizer:
    r = GGUFReader(path)
    toks = _field(r, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in _field(r, "tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(toks)}, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def nll(logits: np.ndarray, ids) -> float:
    lg = logits[:-1]
    lse = np.log(np.exp(lg - lg.max(1, keepdims=True)).sum(1)) + lg.max(1)
    return float(np.mean(lse - lg[np.arange(len(ids) - 1), ids[1:]]))


def main():
    path = sys.argv[1]
    ids = bpe_from_gguf(path).encode(TEXT).ids
    m = NumpyModel(path)
    for neox in (False, True):
        print(f"{m.cfg.arch}: rope {'neox (i, i+d/2)' if neox else 'normal (2i, 2i+1)'}: "
              f"mean NLL {nll(m.forward(ids, neox=neox), ids):.3f} over {len(ids)} tokens")


if __name__ == "__main__":
    main()
