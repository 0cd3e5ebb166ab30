#!/usr/bin/env python3
"""Shared prefix store, one long prefix (issue 24's second target): replica A computes an N-token
prefix and writes it through to Redis; replica B, which never saw it, serves the same prompt from
the store; replica C (no store) recomputes it. Prints TTFT of B and C (and their ratio), the
store entry's bytes against the fp16 KV of the same tokens (how many more prefixes the store holds
than fp16 blocks in the same bytes), and checks that B's tokens equal C's.

  .venv/bin/python bench/store_ttft.py --tokens 8192 --kv-cache vecinfer:d4b8 --threads 16
"""
import argparse
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from replicas_load import stream_completion  # noqa: E402
VQ_BIN = os.environ.get("VQ_BIN", str(ROOT / "build/release/tools/veloxquant/veloxquant"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, threads):
    p = subprocess.Popen([VQ_BIN, "serve", "--port", "0", "-t", str(threads), *args], stderr=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, text=True)
    for line in p.stderr:
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            return p, int(m.group(1))
    raise RuntimeError(f"server exited ({p.wait()})")


def complete(port, prompt, n):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    body = {"model": "m", "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    t0 = time.time()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = json.loads(c.getresponse().read())
    return time.time() - t0, r["choices"][0]["token_ids"]


def metric(port, name):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/metrics")
    m = re.search(rf"^{re.escape(name)} (\S+)$", c.getresponse().read().decode(), re.M)
    return float(m.group(1)) if m else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=8192, help="prefix length (token ids)")
    ap.add_argument("--kv-cache", default="vecinfer:d4b8")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--kv-budget", type=int, default=2048)
    ap.add_argument("-m", "--model", default="")
    a = ap.parse_args()
    redis_bin = shutil.which("redis-server")
    assert redis_bin, "redis-server not found"
    tmp = tempfile.mkdtemp()
    rport = free_port()
    redis = subprocess.Popen([redis_bin, "--port", str(rport), "--bind", "127.0.0.1", "--dir", tmp, "--save", "",
                              "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    common = ["--kv-cache", a.kv_cache, "--kv-budget", str(a.kv_budget), "-c", str(a.tokens + 64)]
    if a.model:
        common += ["-m", a.model]
    store = ["--prefix-store", f"redis://127.0.0.1:{rport}"]
    # Token ids 1000.. (no tokenizer round trip): N - 1 prefix tokens + 1 the request feeds itself.
    prompt = [1000 + (i * 7919) % 40000 for i in range(a.tokens + 1)]
    procs = []
    try:
        pa, A = start_server(common + store, a.threads)
        procs.append(pa)
        t_a, _ = complete(A, prompt, 1)
        deadline = time.time() + 600
        while metric(A, "vq_prefix_store_written_total") < 1 and time.time() < deadline:
            time.sleep(0.1)
        written = metric(A, "vq_prefix_store_written_bytes_total")
        pb, B = start_server(common + store, a.threads)
        procs.append(pb)
        t_b, _, _, _, tok_b = stream_completion(B, prompt, 8)
        adopted = metric(B, "vq_prefix_store_adopted_tokens_total")
        fetched = metric(B, "vq_prefix_store_fetched_bytes_total")
        pc, C = start_server(common, a.threads)
        procs.append(pc)
        t_c, _, _, _, tok_c = stream_completion(C, prompt, 8)
        # fp16 KV of the adopted tokens: layers x KV heads x head_dim x 2 (K, V) x 2 bytes, from the model's info.
        info = subprocess.run([VQ_BIN, "info"] + ([a.model] if a.model else []), capture_output=True,
                              text=True).stdout
        layers = int(re.search(r"layers:\s+(\d+)", info).group(1))
        kvh, hd = map(int, re.search(r"(\d+) KV heads.*head_dim (\d+)", info).groups())
        fp16 = adopted * layers * kvh * hd * 2 * 2
        print(json.dumps({"tokens": a.tokens, "kv_cache": a.kv_cache, "threads": a.threads,
                          "first_request_s": t_a, "store_ttft_s": t_b, "recompute_ttft_s": t_c,
                          "ratio": t_b / t_c, "adopted_tokens": adopted, "entry_bytes": fetched,
                          "written_bytes": written, "same_text": tok_b == tok_c,
                          "fp16_bytes_of_adopted": fp16,
                          "prefixes_per_fp16_bytes": fp16 / fetched if fetched else None}, indent=1))
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=60)
        redis.kill()
        redis.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
