"""CPU side by side (issue 22): veloxquant's prefill and decode beside llama.cpp's on the same
token ids, per model, context and thread count, with llama.cpp at its fastest KV cache type and
flash-attention setting for each context (every setting in --llama-configs is run, the best
prefill and the best decode are kept, and the table names the setting). Ours runs with the fp16
KV cache and with vecinfer:d4b8 (issue 22's targets are stated for d4b8), calibrated once per
model on 2048 tokens of the Jargon File. Run through
bench/cpu_side_by_side.sh, which installs llama-cpp-python."""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
from pathlib import Path

import llama_cpp

# The peer-bench helpers shared with bench/llamacpp_bench.py (same folder: on sys.path when run as a script).
from llamacpp_bench import bench_llamacpp, bench_ours, cpu_name, prompt_ids

# GGML type ids of the KV cache types llama.cpp takes (ggml.h).
KV_TYPES = {"f16": 1, "q8_0": 8, "q4_0": 2}


def load_average():
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def cpu_times():
    """The machine's (steal, total) jiffies from /proc/stat (zeros where it cannot be read)."""
    try:
        f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return (f[7] if len(f) > 7 else 0), sum(f)
    except (OSError, ValueError):
        return 0, 0


def steal_since(t0):
    """Percent of the machine's CPU time stolen by the hypervisor since cpu_times() gave t0."""
    s1, n1 = cpu_times()
    return 100.0 * (s1 - t0[0]) / (n1 - t0[1]) if n1 > t0[1] else 0.0


def trained_context(llm):
    """The model's trained context from its GGUF metadata ({arch}.context_length)."""
    md = getattr(llm, "metadata", None) or {}
    n = md.get(f"{md.get('general.architecture', '')}.context_length")
    if n:
        return int(n)
    try:
        return int(llm.n_ctx_train())
    except AttributeError:
        return 1 << 30  # unknown: run every context


def parse_config(c):
    """'f16' / 'f16+fa' / 'q8_0+fa' -> (kv type, flash attention)."""
    kv, _, fa = c.partition("+")
    if kv not in KV_TYPES or fa not in ("", "fa"):
        raise SystemExit(f"cpu_side_by_side: bad --llama-configs entry '{c}' (KV type f16|q8_0|q4_0, optional +fa)")
    if kv != "f16" and not fa:
        raise SystemExit(f"cpu_side_by_side: '{c}': llama.cpp needs flash attention for a quantized V cache")
    return kv, bool(fa)


def calibration(binary, name, model, kv, folder):
    """The vecinfer calibration file of (model, kv), made once with `veloxquant calibrate` (2048
    tokens of the Jargon File, as bench/kv_speed.sh); None for the KV caches that need none."""
    if not kv.startswith("vecinfer"):
        return None
    folder.mkdir(parents=True, exist_ok=True)
    f = folder / f"{name}_{kv.replace(':', '_').replace('=', '_').replace(',', '_')}.vqcal"
    if not f.exists():
        text = Path("/usr/share/doc/jargon-text/jargon.txt.gz")
        if not text.exists():
            text = Path("/usr/share/common-licenses/GPL-3")
        cmd = [binary, "calibrate", "-m", model, "--text", str(text), "--tokens", "2048", "--kv-cache", kv,
               "-o", str(f)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"cpu_side_by_side: {' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    return f


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", required=True, help="NAME=PATH.gguf,... (in table order)")
    ap.add_argument("--bin", required=True)
    ap.add_argument("--threads", default="1 2")
    ap.add_argument("--contexts", default="512 4096 16384")
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--ours-kv", default="fp16,vecinfer:d4b8")
    ap.add_argument("--llama-configs", default="f16,f16+fa,q8_0+fa,q4_0+fa")
    ap.add_argument("--command", default="bench/cpu_side_by_side.sh")
    ap.add_argument("--json", default="", help="also write the rows here")
    ap.add_argument("--calib-dir", default="build/side_by_side_calib", help="vecinfer calibration files (made once)")
    a = ap.parse_args()
    configs = [parse_config(c) for c in a.llama_configs.split(",")]
    ours_kv = a.ours_kv.split(",")
    models = [m.split("=", 1) for m in a.models.split(",")]
    load_start = load_average()
    rows = []
    for name, path in models:
        probe = llama_cpp.Llama(model_path=path, n_ctx=64, vocab_only=True, verbose=False)
        n_train = trained_context(probe)
        for ctx in map(int, a.contexts.split()):
            if ctx + a.decode + 8 > n_train:
                print(f"{name} ctx {ctx}: past the model's trained context ({n_train}); skipped", flush=True)
                rows.append(dict(model=name, ctx=ctx, skipped=f"trained context {n_train}"))
                continue
            ids = prompt_ids(probe, ctx)
            for t in map(int, a.threads.split()):
                # Repetitions alternate between llama.cpp and ours (each setting once per round), so
                # that a change of the machine's load falls on both sides; medians over the rounds.
                lc = {(kv, fa): ([], []) for kv, fa in configs}
                oc = {kv: ([], []) for kv in ours_kv}
                calibs = {kv: calibration(a.bin, name, path, kv, Path(a.calib_dir)) for kv in ours_kv}
                for rep in range(a.reps):
                    for kv, fa in configs:
                        # CPU share: the share of the decode's wall time the threads ran (CPU-s over
                        # threads x wall-s): a slow round with a low share waited (the VM or a thread
                        # pool), one with a full share did slower work.
                        c0 = cpu_times()
                        pp, tg, tg_cpu = bench_llamacpp(path, t, ids, a.decode, 1, KV_TYPES[kv], fa)
                        lc[(kv, fa)][0].append(pp), lc[(kv, fa)][1].append(tg)
                        print(f"{name} ctx {ctx} t {t} round {rep + 1}: llama.cpp {kv}{'+fa' if fa else ''}: "
                              f"pp {pp:.1f} tg {tg:.1f} (CPU share {tg / (t * tg_cpu):.2f}, "
                              f"steal {steal_since(c0):.1f}%)", flush=True)
                    for kv in ours_kv:
                        c0, st = cpu_times(), []
                        pp, tg, tg_cpu = bench_ours(a.bin, path, t, ids, a.decode, 1, kv, calibs[kv], st)
                        oc[kv][0].append(pp), oc[kv][1].append(tg)
                        ms = sorted(1e3 * x for x in st[-1].get("decode_step_s") or [0.0])  # the decode's steps
                        print(f"{name} ctx {ctx} t {t} round {rep + 1}: ours {kv}: pp {pp:.1f} tg {tg:.1f} "
                              f"(steps {ms[0]:.1f} / {ms[len(ms) // 2]:.1f} / {ms[-1]:.1f} ms, CPU share "
                              f"{tg / (t * tg_cpu):.2f}, steal {steal_since(c0):.1f}%)", flush=True)
                best_pp = best_tg = (0.0, "")
                for (kv, fa), (pps, tgs) in lc.items():
                    label = kv + ("+fa" if fa else "")
                    best_pp = max(best_pp, (statistics.median(pps), label))
                    best_tg = max(best_tg, (statistics.median(tgs), label))
                ours = {kv: (statistics.median(v[0]), statistics.median(v[1])) for kv, v in oc.items()}
                rows.append(dict(model=name, ctx=ctx, threads=t, llama_pp=best_pp[0], llama_pp_cfg=best_pp[1],
                                 llama_tg=best_tg[0], llama_tg_cfg=best_tg[1],
                                 ours={kv: {"pp": v[0], "tg": v[1]} for kv, v in ours.items()}))
    out = []
    p = out.append
    p(f"Date {datetime.datetime.now():%Y-%m-%d %H:%M}, CPU {cpu_name()} ({platform.machine()}, {os.cpu_count()} CPUs), "
      f"load average {load_start} at the start and {load_average()} at the end; llama-cpp-python "
      f"{llama_cpp.__version__} (llama.cpp built from source, native), best of its settings "
      f"{a.llama_configs} per row (the setting in brackets); decode = {a.decode} tokens after the prompt, "
      f"median of {a.reps} round(s), llama.cpp and ours alternating. Command: `{a.command}`.")
    p("")
    head = "| model | context | threads | llama.cpp prefill t/s | " + " | ".join(f"ours prefill ({k})" for k in ours_kv)
    head += " | prefill ratio | llama.cpp decode t/s | " + " | ".join(f"ours decode ({k})" for k in ours_kv)
    head += " | " + " | ".join(f"decode ratio ({k})" for k in ours_kv) + " |"
    p(head)
    p("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        if "skipped" in r:
            p(f"| {r['model']} | {r['ctx']} | - | skipped: past the {r['skipped']} |" + " |" * (head.count("|") - 5))
            continue
        o = r["ours"]
        best_ours_pp = max(v["pp"] for v in o.values())
        line = (f"| {r['model']} | {r['ctx']} | {r['threads']} | {r['llama_pp']:.1f} ({r['llama_pp_cfg']}) | "
                + " | ".join(f"{o[k]['pp']:.1f}" for k in ours_kv)
                + f" | {best_ours_pp / r['llama_pp']:.2f} | {r['llama_tg']:.1f} ({r['llama_tg_cfg']}) | "
                + " | ".join(f"{o[k]['tg']:.1f}" for k in ours_kv) + " | "
                + " | ".join(f"{o[k]['tg'] / r['llama_tg']:.2f}" for k in ours_kv) + " |")
        p(line)
    print("\n" + "\n".join(out))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
