"""llama.cpp's own KV cache types (f16, q8_0, q4_0 with flash attention) on the inputs of a
`veloxquant eval` run, through llama-cpp-python, added to that run's JSON as rows of engine
"llama.cpp". Quality rows score the same token ids (the texts' ids the eval saved) and compare
each type with llama.cpp's f16 cache (its own reference: KL, top-1); retrieval rows answer the same
pass-key prompts greedily and compare with the key and with llama.cpp f16's answer.

Run by bench/eval.sh under build/llamacpp-venv (bench/llamacpp_bench.sh --install-only):
    python bench/eval_llamacpp.py --model M.gguf --inputs inputs.json --merge eval.json
"""
import argparse
import json
import os
import re
import tempfile

import numpy as np
import llama_cpp

# name -> (ggml type id, nominal bits per element: q8_0 / q4_0 add one fp16 scale per 32)
TYPES = {"f16": (llama_cpp.GGML_TYPE_F16, 16.0), "q8_0": (llama_cpp.GGML_TYPE_Q8_0, 8.5),
         "q4_0": (llama_cpp.GGML_TYPE_Q4_0, 4.5)}
BATCH = 256  # tokens per decode call (logits of every row kept)


def make_llm(model, n_ctx, kind, threads):
    t = TYPES[kind][0]
    # flash attention: llama.cpp needs it for a quantized V cache; used for every type alike.
    return llama_cpp.Llama(model_path=model, n_ctx=n_ctx, n_batch=BATCH, n_ubatch=BATCH, n_threads=threads,
                           n_threads_batch=threads, logits_all=True, flash_attn=True, type_k=t, type_v=t,
                           verbose=False)


def batch_logits(llm, ids, n_past):
    """Decodes ids at positions n_past.. and returns their logits [len(ids), n_vocab] (a copy)."""
    llm._batch.set_batch(batch=ids, n_past=n_past, logits_all=True)
    llm._ctx.decode(llm._batch)
    llm.n_tokens = n_past + len(ids)
    v = llm.n_vocab()
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(len(ids) * v,)).reshape(len(ids), v).copy()


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


def quality(model, ids, kinds, threads):
    """Per kind: nll sum, kl sum and top-1 agreement vs f16 over the len(ids) - 1 scored positions."""
    n = len(ids)
    llms = {k: make_llm(model, n, k, threads) for k in ["f16"] + [k for k in kinds if k != "f16"]}
    out = {k: {"nll": 0.0, "kl": 0.0, "agree": 0} for k in llms}
    for b in range(0, n, BATCH):
        chunk = ids[b:b + BATCH]
        scored = min(len(chunk), n - 1 - b)  # the last token predicts nothing inside the window
        nxt = np.array(ids[b + 1:b + 1 + scored])
        ref = log_softmax(batch_logits(llms["f16"], chunk, b)[:scored])
        ref_p = np.exp(ref)
        for k, llm in llms.items():
            lp = ref if k == "f16" else log_softmax(batch_logits(llm, chunk, b)[:scored])
            out[k]["nll"] -= lp[np.arange(scored), nxt].sum()
            out[k]["kl"] += np.maximum((ref_p * (ref - lp)).sum(axis=1), 0.0).sum()
            out[k]["agree"] += int((lp.argmax(axis=1) == ref.argmax(axis=1)).sum())
    for llm in llms.values():
        llm.close()
    return out, n - 1


def answer(llm, prompt, n_new):
    llm.reset()
    logits = None
    for b in range(0, len(prompt), BATCH):
        logits = batch_logits(llm, prompt[b:b + BATCH], b)
    last, toks = logits[-1], []
    for i in range(n_new):
        t = int(np.argmax(last))
        if llm.token_eos() == t:
            break
        toks.append(t)
        text = llm.detokenize(toks).decode("utf-8", errors="replace")
        m = re.search(r"\d+", text)
        if m and m.end() < len(text):
            break
        last = batch_logits(llm, [t], len(prompt) + i)[-1]
    text = llm.detokenize(toks).decode("utf-8", errors="replace")
    m = re.search(r"\d+", text)
    return m.group(0) if m else ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--inputs", required=True, help="JSON written by veloxquant eval --save-inputs")
    ap.add_argument("--merge", required=True, help="the eval JSON to add llama.cpp rows to (rewritten)")
    ap.add_argument("--types", nargs="+", default=list(TYPES))
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--no-retrieval", action="store_true")
    a = ap.parse_args()
    inp = json.load(open(a.inputs))
    doc = json.load(open(a.merge))
    s = inp["settings"]
    qrows, rrows = [], []
    for t in inp["texts"]:
        for ctx in s["contexts"]:
            print(f"eval_llamacpp: quality {t['name']} ctx {ctx}", flush=True)
            res, n_scored = quality(a.model, t["ids"][:ctx], a.types, a.threads)
            ref_ppl = float(np.exp(res["f16"]["nll"] / n_scored))
            for k in a.types:
                ppl = float(np.exp(res[k]["nll"] / n_scored))
                qrows.append({"engine": "llama.cpp", "kv_cache": k, "flash_attn": True, "text": t["name"], "n_ctx": ctx,
                              "tokens_scored": n_scored, "perplexity": ppl, "ref_perplexity": ref_ppl,
                              "ppl_delta": ppl / ref_ppl - 1.0, "kl": res[k]["kl"] / n_scored,
                              "top1": res[k]["agree"] / n_scored, "bits_per_element": TYPES[k][1],
                              "bits_nominal": TYPES[k][1]})
    prompts = inp.get("retrieval_prompts", [])
    if prompts and not a.no_retrieval:
        n_new = s.get("answer_tokens", 8)
        groups = {}
        for p in prompts:
            groups.setdefault((p["n_ctx"], p["depth"]), []).append(p)
        for (ctx, depth), ps in sorted(groups.items()):
            print(f"eval_llamacpp: retrieval ctx {ctx} depth {depth}", flush=True)
            llms = {k: make_llm(a.model, ctx + n_new + 8, k, a.threads) for k in a.types}
            ans = {k: [answer(llms[k], p["ids"], n_new) for p in ps] for k in a.types}
            ref = ans.get("f16", [None] * len(ps))
            for k in a.types:
                ok = sum(x == p["key"] for x, p in zip(ans[k], ps))
                rrows.append({"engine": "llama.cpp", "kv_cache": k, "flash_attn": True, "n_ctx": ctx, "depth": depth,
                              "trials": len(ps), "correct": ok, "agree_ref": sum(x == r for x, r in zip(ans[k], ref)),
                              "rate": ok / len(ps), "answers": ans[k]})
            for llm in llms.values():
                llm.close()
    doc["quality"] = [r for r in doc.get("quality", []) if r.get("engine") != "llama.cpp"] + qrows
    doc["retrieval"] = [r for r in doc.get("retrieval", []) if r.get("engine") != "llama.cpp"] + rrows
    doc["llama_cpp"] = {"version": llama_cpp.__version__, "flash_attn": True, "batch": BATCH,
                        "reference": "llama.cpp f16 (its own)"}
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(a.merge)), suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, a.merge)
    print(f"eval_llamacpp: {len(qrows)} quality and {len(rrows)} retrieval rows -> {a.merge}")


if __name__ == "__main__":
    main()
