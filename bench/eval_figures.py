"""PNG figures from `veloxquant eval` JSON documents (bench/eval.sh): per model,
  quality_<model>.png    KL vs fp16 and perplexity change against bits per element, one point per
                         KV cache (mean over the texts at the largest quality context; veloxquant's
                         caches and llama.cpp's own types, each against its engine's fp16)
  retrieval_<model>.png  pass-key retrieval rate against the key's depth, one panel per context.
    python bench/eval_figures.py --out docs/figures eval_smollm2.json [eval_gemma3.json ...]
With --markdown, also prints the quality and retrieval tables (docs/BENCHMARKS.md) to stdout.
"""
import argparse
import json
import os
import re
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MARK = {"veloxquant": "o", "llama.cpp": "s"}


def model_tag(doc):
    m = doc.get("model", {})
    name = m.get("file") or m.get("name") or "model"
    # The file's stem before its quantization suffix: SmolLM2-135M-Instruct.Q4_1.gguf ->
    # smollm2-135m-instruct, qwen2.5-coder-1.5b-instruct-q4_k_m.gguf -> qwen2-5-coder-1-5b-instruct.
    stem = re.sub(r"\.gguf$", "", name)
    stem = re.sub(r"[.-](q\d\w*|f16|bf16|f32)$", "", stem, flags=re.I)
    stem = re.sub(r"\.(q\d\w*|f16|bf16|f32)$", "", stem, flags=re.I)
    return re.sub(r"[^A-Za-z0-9]+", "-", stem).strip("-").lower()


def label(row):
    return ("llama.cpp " if row["engine"] == "llama.cpp" else "") + row["kv_cache"]


def mean_by_method(rows, ctx):
    acc = defaultdict(list)
    for r in rows:
        if r["n_ctx"] == ctx:
            acc[(r["engine"], r["kv_cache"])].append(r)
    out = []
    for (engine, kv), rs in acc.items():
        n = len(rs)
        out.append({"engine": engine, "kv_cache": kv, "kl": sum(r["kl"] for r in rs) / n,
                    "ppl_delta": sum(r["ppl_delta"] for r in rs) / n, "top1": sum(r["top1"] for r in rs) / n,
                    "bits": sum(r["bits_per_element"] for r in rs) / n, "texts": n})
    return sorted(out, key=lambda r: (-r["bits"], r["engine"]))


def quality_figure(doc, path):
    rows = doc["quality"]
    ctx = max(r["n_ctx"] for r in rows)
    pts = [p for p in mean_by_method(rows, ctx) if p["kv_cache"] not in ("fp16", "f16")]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for ax, key, ylab, scale in ((axes[0], "kl", "KL vs fp16 (nats/token)", "log"),
                                 (axes[1], "ppl_delta", "perplexity vs fp16 (%)", "linear")):
        for p in pts:
            y = p[key] * (100 if key == "ppl_delta" else 1)
            if scale == "log":
                y = max(y, 1e-4)
            ax.scatter(p["bits"], y, marker=MARK.get(p["engine"], "^"), s=60,
                       color="tab:orange" if p["engine"] == "llama.cpp" else "tab:blue")
            ax.annotate(label(p), (p["bits"], y), textcoords="offset points", xytext=(5, 4), fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_yscale(scale)
        ax.set_xlabel("bits per element (measured at this context: codes + fp16 window/sinks)")
        ax.set_ylabel(ylab)
        ax.grid(True, which="both", alpha=0.3)
        if key == "ppl_delta":
            ax.axhline(0, color="gray", lw=0.8)
    texts = ", ".join(t["name"] for t in doc.get("texts", []))
    fig.suptitle(f"{doc['model'].get('file', '')}: KV cache quality at context {ctx} "
                 f"(mean over {texts}); blue: veloxquant, orange: llama.cpp (flash attention, its own f16)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def retrieval_figure(doc, path):
    rows = doc["retrieval"]
    ctxs = sorted({r["n_ctx"] for r in rows})
    fig, axes = plt.subplots(1, len(ctxs), figsize=(4.2 * len(ctxs), 4), sharey=True, squeeze=False)
    methods = []
    for r in rows:
        if (r["engine"], r["kv_cache"]) not in methods:
            methods.append((r["engine"], r["kv_cache"]))
    cmap = plt.get_cmap("tab20")
    for ax, ctx in zip(axes[0], ctxs):
        for i, (engine, kv) in enumerate(methods):
            rs = sorted((r for r in rows if r["n_ctx"] == ctx and r["engine"] == engine and r["kv_cache"] == kv),
                        key=lambda r: r["depth"])
            if not rs:
                continue
            # a small vertical offset per method keeps identical lines visible
            off = (i - len(methods) / 2) * 0.008
            ax.plot([r["depth"] for r in rs], [r["rate"] + off for r in rs], marker=MARK.get(engine, "^"),
                    ls="--" if engine == "llama.cpp" else "-", color=cmap(i % 20),
                    label=("llama.cpp " if engine == "llama.cpp" else "") + kv)
        trials = max(r["trials"] for r in rows if r["n_ctx"] == ctx)
        ax.set_title(f"context {ctx} ({trials} prompts per depth)", fontsize=10)
        ax.set_xlabel("depth of the pass key (0 = start)")
        ax.set_ylim(-0.1, 1.1)
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("retrieval rate")
    axes[0][-1].legend(fontsize=7, loc="lower left")
    fig.suptitle(f"{doc['model'].get('file', '')}: pass-key retrieval", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown_tables(doc):
    """The quality rows (per text and context) and the retrieval rates (per context, over depths)."""
    lines = ["| text | ctx | engine | KV cache | bits/elem nominal | bits/elem measured | ppl | vs fp16 | KL | top-1 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(doc.get("quality", []), key=lambda r: (r["text"], r["n_ctx"], r["engine"] != "veloxquant",
                                                            -r.get("bits_nominal", 16))):
        nominal = r.get("bits_nominal")
        lines.append(f"| {r['text']} | {r['n_ctx']} | {r['engine']} | {r['kv_cache']} | "
                     f"{'' if nominal is None else f'{nominal:g}'} | {r['bits_per_element']:.2f} | "
                     f"{r['perplexity']:.3f} | {100 * r['ppl_delta']:+.2f}% | {r['kl']:.4f} | {100 * r['top1']:.1f}% |")
    rows = doc.get("retrieval", [])
    if rows:
        keys = sorted({(r["n_ctx"], r["depth"]) for r in rows})
        lines += ["", "| engine | KV cache | " + " | ".join(f"ctx {c} @ {d:g}" for c, d in keys) + " |",
                  "|---|---|" + "---|" * len(keys)]
        methods = []
        for r in rows:
            if (r["engine"], r["kv_cache"]) not in methods:
                methods.append((r["engine"], r["kv_cache"]))
        for engine, kv in methods:
            cell = {(r["n_ctx"], r["depth"]): f"{r['correct']}/{r['trials']}" for r in rows
                    if r["engine"] == engine and r["kv_cache"] == kv}
            lines.append(f"| {engine} | {kv} | " + " | ".join(cell.get(k, "") for k in keys) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json", nargs="+")
    ap.add_argument("--out", default="docs/figures")
    ap.add_argument("--markdown", action="store_true", help="print the tables for docs/BENCHMARKS.md")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for p in a.json:
        doc = json.load(open(p))
        tag = model_tag(doc)
        if doc.get("quality"):
            quality_figure(doc, os.path.join(a.out, f"quality_{tag}.png"))
        if doc.get("retrieval"):
            retrieval_figure(doc, os.path.join(a.out, f"retrieval_{tag}.png"))
        print(f"eval_figures: {p} -> {a.out}/*_{tag}.png")
        if a.markdown:
            print(markdown_tables(doc))


if __name__ == "__main__":
    main()
