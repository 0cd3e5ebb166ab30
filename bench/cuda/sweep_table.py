#!/usr/bin/env python3
"""Joins bench_paged_attention --sweep's rows with torch_peers.py sweep's rows (same shapes) into
one markdown table: per (geometry, B, S) the SDPA fp16 time, then each cache's (and each dense
variant's) graph-replayed time and its speed-up over SDPA (SDPA ms / ours; >= 1 is faster).
  sweep_table.py paged.log torch.log [--variants]   (--variants: one column per fp16 variant)"""
import re
import sys


def fields(line):
    return dict(re.findall(r"(\w+)=(\S+)", line))


def main():
    paged, torch_log = sys.argv[1], sys.argv[2]
    by_variant = "--variants" in sys.argv
    sdpa, deq, ours, cols = {}, {}, {}, []
    for line in open(torch_log):
        if line.startswith("torch_sweep") and "sdpa_fp16_ms" in line:
            f = fields(line)
            key = (f["geo"], int(f["B"]), int(f["S"]))
            sdpa[key] = float(f["sdpa_fp16_ms"])
            deq[key] = float(f["dequant_sdpa_ms"])
    for line in open(paged):
        if line.startswith("paged_attn") and "graph_ms" in line:
            f = fields(line)
            key = (f["geo"], int(f["B"]), int(f["S"]))
            col = f["kv"] + (f" v{f['variant']}" if by_variant and f["kv"] == "fp16" else "")
            if col not in cols:
                cols.append(col)
            ours[(key, col)] = float(f["graph_ms"])
    keys = sorted({k for (k, _) in ours}, key=lambda k: (k[0], k[1], k[2]))
    order = []
    for k in keys:
        if k[0] not in order:
            order.append(k[0])
    keys.sort(key=lambda k: (order.index(k[0]), k[1], k[2]))
    head = "| geometry | B | S | SDPA ms | deq+SDPA ms | " + " | ".join(f"{c} ms (x SDPA)" for c in cols) + " |"
    print(head)
    print("|" + "---|" * (5 + len(cols)))
    worst = {c: (1e9, None) for c in cols}
    for k in keys:
        s = sdpa.get(k)
        row = [k[0], str(k[1]), f"{k[2] // 1024}K", f"{s:.4f}" if s else "-", f"{deq.get(k, float('nan')):.3f}"]
        for c in cols:
            m = ours.get((k, c))
            if m is None:
                row.append("-")
                continue
            r = s / m if s else float("nan")
            row.append(f"{m:.4f} ({r:.2f}x)" if s else f"{m:.4f}")
            if s and r < worst[c][0]:
                worst[c] = (r, k)
        print("| " + " | ".join(row) + " |")
    for c in cols:
        r, k = worst[c]
        if k:
            print(f"worst {c}: {r:.2f}x SDPA at {k[0]} B={k[1]} S={k[2]}")


if __name__ == "__main__":
    main()
