"""Prefill and decode tokens/s: llama.cpp (llama-cpp-python) vs veloxquant, same model, machine
and prompt ids. Run through bench/llamacpp_bench.sh (which installs llama-cpp-python)."""
import argparse
import datetime
import os
import json
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import llama_cpp


def cpu_name():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def prompt_ids(llm, n):
    text_file = Path("/usr/share/common-licenses/GPL-3")
    text = text_file.read_text() if text_file.exists() else " ".join(f"word{i}" for i in range(20000))
    ids = llm.tokenize(text.encode(), add_bos=False)
    while len(ids) < n:
        ids = ids + ids
    return ids[:n]


def bench_llamacpp(model, threads, ids, n_decode, reps, kv_type=None, flash_attn=False):
    """llama.cpp's prefill and decode tokens/s and decode tokens per CPU-second (medians over reps).
    kv_type: the GGML type id of its KV cache (None: its default, f16); flash_attn: its setting."""
    kv = {} if kv_type is None else {"type_k": kv_type, "type_v": kv_type}
    llm = llama_cpp.Llama(model_path=model, n_ctx=len(ids) + n_decode + 8, n_batch=512, n_ubatch=512,
                          n_threads=threads, n_threads_batch=threads, flash_attn=flash_attn, verbose=False, **kv)
    pp, tg, tg_cpu = [], [], []
    for _ in range(reps):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        pp.append(len(ids) / (time.perf_counter() - t0))
        dt = dc = 0.0
        tok = ids[-1]
        for _ in range(n_decode):
            t0, c0 = time.perf_counter(), time.process_time()
            llm.eval([tok])
            dt += time.perf_counter() - t0
            dc += time.process_time() - c0
        tg.append(n_decode / dt)
        tg_cpu.append(n_decode / dc)
    del llm
    return statistics.median(pp), statistics.median(tg), statistics.median(tg_cpu)


def bench_ours(binary, model, threads, ids, n_decode, reps, kv, calib=None, stats=None):
    """Our `generate` on the same token ids: medians of prefill and decode tokens/s, and decode tokens per
    CPU-second. calib: a calibration file for vecinfer caches (None: the default model's first-use one).
    stats: a list that receives each run's --stats-json (per-step decode times among them)."""
    pp, tg, tg_cpu = [], [], []
    with tempfile.TemporaryDirectory() as d:
        idf = Path(d) / "ids.txt"
        idf.write_text(" ".join(map(str, ids)))
        for _ in range(reps):
            js = Path(d) / "stats.json"
            cmd = [binary, "generate", "-m", model, "--prompt-ids", f"@{idf}", "-n", str(n_decode + 1),
                   "--ignore-eos", "--temp", "0", "-t", str(threads), "-q", "--kv-cache", kv,
                   "-c", str(len(ids) + n_decode + 8), "--stats-json", str(js)]
            if calib:
                cmd += ["--calib", str(calib)]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"bench_ours: {' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
            s = json.loads(js.read_text())
            if stats is not None:
                stats.append(s)
            pp.append(s["prefill_tps"])
            tg.append(s["decode_tps"])
            tg_cpu.append(s["n_decoded"] / s["decode_cpu_s"])
    return statistics.median(pp), statistics.median(tg), statistics.median(tg_cpu)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--threads", default="1 2")
    ap.add_argument("--contexts", default="512 4096")
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--kv", default="fp16")
    ap.add_argument("--write-doc", default="", help="append the table to this Markdown file's section")
    ap.add_argument("--section", default="Model runtime (CPU)")
    ap.add_argument("--doc-note", default="")
    ap.add_argument("--command", default="bench/llamacpp_bench.sh")
    a = ap.parse_args()
    probe = llama_cpp.Llama(model_path=a.model, n_ctx=64, vocab_only=True, verbose=False)
    rows = []
    for ctx in map(int, a.contexts.split()):
        ids = prompt_ids(probe, ctx)
        for t in map(int, a.threads.split()):
            lpp, ltg, lcpu = bench_llamacpp(a.model, t, ids, a.decode, a.reps)
            opp, otg, ocpu = bench_ours(a.bin, a.model, t, ids, a.decode, a.reps, a.kv)
            rows.append((t, ctx, lpp, opp, ltg, otg, lcpu, ocpu))
            print(f"threads {t} ctx {ctx}: llama.cpp pp {lpp:.1f} tg {ltg:.1f} (cpu {lcpu:.1f}) | "
                  f"ours pp {opp:.1f} tg {otg:.1f} (cpu {ocpu:.1f})", flush=True)
    out = []
    p = out.append
    p(f"Date {datetime.date.today()}, CPU {cpu_name()} ({platform.machine()}), "
          f"llama-cpp-python {llama_cpp.__version__} (llama.cpp built from source, f16 KV cache, defaults), "
          f"ours: --kv-cache {a.kv}; decode = {a.decode} tokens after the prompt, median of {a.reps} runs. "
      f"Command: `{a.command}`.")
    p("")
    p("Decode per CPU-second: tokens / process CPU time (all threads) during decode; on a busy "
          "machine it measures the work done rather than the wait for a core.")
    p("")
    p("| threads | prompt | llama.cpp prefill t/s | ours prefill t/s | ratio | llama.cpp decode t/s | "
          "ours decode t/s | ratio | llama.cpp decode / CPU-s | ours decode / CPU-s |")
    p("|---|---|---|---|---|---|---|---|---|---|")
    for t, ctx, lpp, opp, ltg, otg, lcpu, ocpu in rows:
        p(f"| {t} | {ctx} | {lpp:.1f} | {opp:.1f} | {opp / lpp:.2f} | {ltg:.1f} | {otg:.1f} | "
              f"{otg / ltg:.2f} | {lcpu:.1f} | {ocpu:.1f} |")
    try:
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        load = "?"
    p("")
    p(f"Load average at the end of the run: {load} (on {os.cpu_count()} CPUs).")
    print("\n" + "\n".join(out))
    if a.write_doc:
        write_section(Path(a.write_doc), a.section, "\n".join(out), a.doc_note)


def write_section(doc, title, table, note):
    """Appends a run under the section `## title` (kept between it and the next `## `)."""
    text = doc.read_text() if doc.exists() else ""
    head = f"## {title}"
    block = f"### Run of {datetime.datetime.now():%Y-%m-%d %H:%M}\n\n{note + chr(10) + chr(10) if note else ''}{table}\n"
    if head not in text:
        text = text.rstrip() + f"\n\n{head}\n\n{block}"
    else:
        start = text.index(head) + len(head)
        nxt = text.find("\n## ", start)
        end = len(text) if nxt < 0 else nxt + 1
        body = text[start:end].strip()
        body = "" if body == "(pending)" else body
        text = text[:start] + "\n\n" + (body + "\n\n" if body else "") + block + ("\n" if nxt >= 0 else "") + text[end:]
    doc.write_text(text)


if __name__ == "__main__":
    main()
