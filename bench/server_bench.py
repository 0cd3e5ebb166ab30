"""Serving benchmark: veloxquant serve against llama-cpp-python's server (llama.cpp), same model,
same machine, same run. Prints (and optionally appends to docs/BENCHMARKS.md) one table:
  - load: C concurrent clients, R streamed requests of short distinct prompts, M new tokens each
    (greedy, ignore_eos): aggregate generated tokens/s and time to first token p50/p99;
  - prefix: time to first token of a request whose 2k-token prompt prefix was seen before (hit)
    vs one whose prefix is new (miss), median of 3 pairs;
  - 4k conversations in the KV budget: ours from the pool bytes one 4096-token conversation holds
    in a running server (/metrics), llama.cpp's from the KV size it allocates for a 4096-token
    context (its own log line), for f16 and q4_0 caches.
Not a test. bench/server_bench.sh installs llama-cpp-python[server] and runs this."""
import argparse
import concurrent.futures as cf
import datetime
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

from openai import OpenAI

WORDS = ("river stone cloud maple lantern copper violet harbor meadow falcon ember orchard quartz "
         "willow canyon saffron glacier thimble basalt juniper").split()


T0 = time.time()


def say(msg):
    print(f"[{time.time() - T0:7.1f}s, load {os.getloadavg()[0]:.1f}] {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A server process on a port; waits for /v1/models to answer."""

    def __init__(self, cmd, port, env=None, log=None):
        self.log = open(log or os.devnull, "w")
        self.p = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 600
        while True:
            if self.p.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited with {self.p.returncode}; see {log}")
            try:
                urllib.request.urlopen(self.url + "/v1/models", timeout=2).read()
                break
            except Exception:
                if time.time() > deadline:
                    raise RuntimeError(f"{cmd} did not start")
                time.sleep(0.5)
        self.client = OpenAI(base_url=self.url + "/v1", api_key="x", max_retries=0, timeout=3600)

    def metric(self, name):
        text = urllib.request.urlopen(self.url + "/metrics", timeout=10).read().decode()
        return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))

    def stop(self):
        self.p.send_signal(signal.SIGINT)
        try:
            self.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.p.kill()
        self.log.close()


def stream_one(client, prompt, max_tokens, extra=None):
    """(time to first token, tokens generated, seconds) of one streamed completion."""
    t0 = time.perf_counter()
    ttft, n = None, 0
    for ev in client.completions.create(model="m", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                        stream=True, extra_body=extra or {}):
        if ev.choices and ev.choices[0].text:
            if ttft is None:
                ttft = time.perf_counter() - t0
            n += 1  # one event per token on both servers (text may be held back rarely)
    return ttft if ttft is not None else time.perf_counter() - t0, n, time.perf_counter() - t0


def load_test(client, clients, requests, max_tokens, extra):
    prompts = [f"Write a short note about the {WORDS[i % 20]} and the {WORDS[(3 * i + 7) % 20]} number {i}."
               for i in range(requests)]
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(clients) as ex:
        res = list(ex.map(lambda p: stream_one(client, p, max_tokens, extra), prompts))
    wall = time.perf_counter() - t0
    ttfts = sorted(r[0] for r in res)
    q = lambda f: ttfts[min(len(ttfts) - 1, int(f * len(ttfts)))]
    short = [r[1] for r in res if r[1] < max_tokens]
    if short:  # an event may carry two tokens (UTF-8 held back), or a server stopped early
        say(f"{len(short)} of {len(res)} requests streamed fewer than {max_tokens} text events: {short[:8]}")
    return {"tok_s": sum(r[1] for r in res) / wall, "ttft_p50": q(0.5), "ttft_p99": q(0.99), "wall": wall,
            "tokens": sum(r[1] for r in res)}


def shared_prompt(k, n_words=660):
    # ~2,050 tokens of varied text (SmolLM2 tokenizer: ~3.1 per word); k makes each prefix new.
    return " ".join(f"{WORDS[(i * 7 + k) % 20]}{(i * 13 + k) % 97}" for i in range(n_words))


def prefix_test(client, extra):
    """Median TTFT of: a new 2k-token prefix (miss); the second request sharing it; the third (by then
    the cache holds the prefix up to where the first two diverged: the steady state of a shared
    system prompt)."""
    miss, second, third = [], [], []
    for k in range(3):
        s = shared_prompt(k + 100)
        miss.append(stream_one(client, s + " Question one: what comes next?", 4, extra)[0])
        second.append(stream_one(client, s + " Question two: what came first?", 4, extra)[0])
        third.append(stream_one(client, s + " Question three: which is the largest?", 4, extra)[0])
    return statistics.median(miss), statistics.median(second), statistics.median(third)


def ours_model_args(a):
    if a.default_model:
        return []
    return ["-m", a.model] + (["--calib", a.calib] if a.calib else [])


def ours_conv_bytes(bin_, model_args, kv, threads, ctx=4096):
    """Pool bytes one running conversation of ~ctx tokens holds (no prefix cache: nothing else)."""
    port = free_port()
    srv = Proc([bin_, "serve", *model_args, "--kv-cache", kv, "--port", str(port), "-t", str(threads),
                "--no-prefix-cache", "--kv-budget", "4096", "-c", str(ctx + 64)], port)
    try:
        ids = [(i * 7919) % 40000 + 100 for i in range(ctx - 1)]  # ctx-1 prompt tokens, then one decoded
        out = {}

        def run():
            for ev in srv.client.completions.create(model="m", prompt=ids, max_tokens=60, temperature=0,
                                                    stream=True, extra_body={"ignore_eos": True}):
                if ev.choices and ev.choices[0].text and "bytes" not in out:
                    out["bytes"] = srv.metric("vq_kv_pool_used_bytes")
        t = threading.Thread(target=run)
        t.start()
        t.join()
        return out["bytes"]
    finally:
        srv.stop()


def llama_kv_bytes(py, model, type_kv, ctx=4096):
    """The KV bytes llama.cpp allocates for a ctx-token context (from its log)."""
    code = ("import llama_cpp,sys\n"
            f"t={{'f16':1,'q4_0':2,'q8_0':8}}['{type_kv}']\n"
            f"llama_cpp.Llama(model_path=sys.argv[1], n_ctx={ctx}, type_k=t, type_v=t, flash_attn=True, verbose=True)\n")
    r = subprocess.run([py, "-c", code, model], capture_output=True, text=True, timeout=600)
    m = re.search(r"KV buffer size\s*=\s*([\d.]+)\s*MiB", r.stderr)
    if not m:
        raise RuntimeError("no KV size in llama.cpp's log:\n" + r.stderr[-2000:])
    return float(m.group(1)) * 1048576


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--llama-python", required=True)
    ap.add_argument("--kv", default="vecinfer:d4b8")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--budget-mib", type=float, default=1024, help="KV budget for the 4k-conversation count")
    ap.add_argument("--default-model", action="store_true",
                    help="the model is veloxquant's default one (its first-use VecInfer calibration applies)")
    ap.add_argument("--calib", default="", help="calibration file for a vecinfer --kv with another model")
    ap.add_argument("--eog-ids", default="0,1,2", help="end-of-generation token ids (SmolLM2: 0, 1, 2)")
    ap.add_argument("--command", default="")
    ap.add_argument("--write-doc", default="")
    a = ap.parse_args()
    load_before = os.getloadavg()[0]
    rows = {}
    # ours
    port = free_port()
    srv = Proc([a.bin, "serve", *ours_model_args(a), "--kv-cache", a.kv, "--port", str(port), "-t", str(a.threads),
                "--parallel", str(a.clients), "--kv-budget", str(a.budget_mib), "-c", "8192"], port,
               log="/tmp/vq_server_bench.log")
    try:
        stream_one(srv.client, "warm up", 4)
        say("ours: load test")
        rows["ours"] = load_test(srv.client, a.clients, a.requests, a.max_tokens, {"ignore_eos": True})
        say(f"ours: {rows['ours']}; prefix test")
        rows["ours"]["miss"], rows["ours"]["second"], rows["ours"]["hit"] = prefix_test(srv.client, {})
    finally:
        srv.stop()
    # llama.cpp through llama-cpp-python's server (one context; requests are served one at a time)
    port = free_port()
    env = dict(os.environ)
    srv = Proc([a.llama_python, "-m", "llama_cpp.server", "--model", a.model, "--model_alias", "m", "--port",
                str(port), "--host", "127.0.0.1", "--n_ctx", "8192", "--n_threads", str(a.threads),
                "--n_threads_batch", str(a.threads), "--n_batch", "512",
                # By default a new request interrupts the one streaming; here they queue instead.
                "--interrupt_requests", "False"], port, env=env,
               log="/tmp/llamacpp_server_bench.log")
    try:
        stream_one(srv.client, "warm up", 4)
        say("llama.cpp: load test")
        # No ignore_eos there: the end-of-text tokens are banned instead, so both run max_tokens.
        no_eos = {"logit_bias": {str(t): -100 for t in a.eog_ids.split(",")}}
        rows["llama"] = load_test(srv.client, a.clients, a.requests, a.max_tokens, no_eos)
        say(f"llama.cpp: {rows['llama']}; prefix test")
        rows["llama"]["miss"], rows["llama"]["second"], rows["llama"]["hit"] = prefix_test(srv.client, {})
    finally:
        srv.stop()
    say("4k conversations")
    budget = a.budget_mib * 1048576
    conv = ours_conv_bytes(a.bin, ours_model_args(a), a.kv, a.threads)
    f16 = llama_kv_bytes(a.llama_python, a.model, "f16")
    q4 = llama_kv_bytes(a.llama_python, a.model, "q4_0")
    load_after = os.getloadavg()[0]
    n_ours, n_f16, n_q4 = int(budget // conv), int(budget // f16), int(budget // q4)
    o, l = rows["ours"], rows["llama"]
    lines = [
        f"| | veloxquant serve ({a.kv}) | llama-cpp-python server (llama.cpp, f16) | ratio |",
        "| --- | ---: | ---: | ---: |",
        f"| generated tokens/s, {a.clients} clients x {a.requests // a.clients} requests x {a.max_tokens} tokens | "
        f"{o['tok_s']:.1f} | {l['tok_s']:.1f} | {o['tok_s'] / l['tok_s']:.2f}x |",
        f"| time to first token p50 (s) | {o['ttft_p50']:.3f} | {l['ttft_p50']:.3f} | |",
        f"| time to first token p99 (s) | {o['ttft_p99']:.3f} | {l['ttft_p99']:.3f} | |",
        f"| TTFT, 2k-token shared prefix: new (miss), s | {o['miss']:.3f} | {l['miss']:.3f} | |",
        f"| ... 2nd request sharing it, s (% of miss) | {o['second']:.3f} ({100 * o['second'] / o['miss']:.1f}%) | "
        f"{l['second']:.3f} ({100 * l['second'] / l['miss']:.1f}%) | |",
        f"| ... 3rd request sharing it (hit), s (% of miss) | {o['hit']:.3f} ({100 * o['hit'] / o['miss']:.1f}%) | "
        f"{l['hit']:.3f} ({100 * l['hit'] / l['miss']:.1f}%) | |",
        f"| KV bytes of one 4096-token conversation | {conv / 1048576:.2f} MiB | f16 {f16 / 1048576:.2f} MiB, "
        f"q4_0 {q4 / 1048576:.2f} MiB | |",
        f"| 4k-token conversations in {a.budget_mib:.0f} MiB of KV | {n_ours} | f16 {n_f16}, q4_0 {n_q4} | "
        f"{n_ours / max(n_f16, 1):.1f}x f16, {n_ours / max(n_q4, 1):.2f}x q4_0 |",
    ]
    head = (f"{datetime.date.today()}, {platform.node()} ({os.cpu_count()} cores), {a.threads} threads, "
            f"load average {load_before:.2f} before / {load_after:.2f} after; command: `{a.command}`")
    table = head + "\n\n" + "\n".join(lines) + "\n"
    print(table)
    if a.write_doc:
        with open(a.write_doc, "a") as f:
            f.write("\n" + table)


if __name__ == "__main__":
    main()
