"""llama.cpp's view of a model, through llama-cpp-python, for the parity tests.

Runs under the interpreter that has llama-cpp-python (build/llamacpp-venv, installed by
`bench/llamacpp_bench.sh --install-only`), not the test venv: the test calls it as a program.

    python llamacpp_logits.py --model M.gguf --request req.json --out out.npz [--threads N] [--kv-f32]

req.json: {"items": [{"name": str, "text": str | null, "ids": [int], "n_prompt": int,
                      "n_gen": int}, ...]}
For every item the .npz gets:
    <name>.tok     llama.cpp's tokenization of `text` (BOS added, special tokens parsed), when given
    <name>.logits  [len(ids), n_vocab] f32: the logits after each of `ids`, fed as one batch
    <name>.greedy  [n_gen] i32: llama.cpp's own greedy continuation of ids[:n_prompt]
"""
import argparse
import json

import numpy as np
from llama_cpp import Llama


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--request", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-f32", action="store_true", help="f32 K/V cache (default f16, as llama.cpp's)")
    a = ap.parse_args()
    items = json.load(open(a.request))["items"]
    n_ctx = max(max(len(it["ids"]), it["n_prompt"] + it["n_gen"]) for it in items) + 8
    # logits_all: the scores of every position of a batch are kept (n_ctx x n_vocab floats).
    kv = {"type_k": 0, "type_v": 0} if a.kv_f32 else {}  # GGML_TYPE_F32
    llm = Llama(model_path=a.model, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=a.threads,
                logits_all=True, verbose=False, **kv)
    out = {}
    for it in items:
        name, ids = it["name"], [int(t) for t in it["ids"]]
        if it.get("text") is not None:
            out[name + ".tok"] = np.array(llm.tokenize(it["text"].encode("utf-8"), add_bos=True, special=True),
                                          dtype=np.int32)
        llm.reset()
        llm.eval(ids)
        out[name + ".logits"] = np.array(llm.scores[:len(ids)], dtype=np.float32)
        llm.reset()
        llm.eval(ids[:it["n_prompt"]])
        gen = []
        for _ in range(it["n_gen"]):
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            gen.append(tok)
            llm.eval([tok])
        out[name + ".greedy"] = np.array(gen, dtype=np.int32)
    np.savez(a.out, **out)


if __name__ == "__main__":
    main()
