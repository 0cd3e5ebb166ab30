#!/usr/bin/env python3
"""Multi-replica load test (issue 24): conversations x turns sharing a few long system prompts, sent
through SGLang's router to N replicas of `veloxquant serve` (scripts/replicas.sh brings each
deployment up and down), with and without the router's cache-aware policy and the shared prefix
store. Per deployment: aggregate tokens/s, TTFT p50/p99 (client side, streaming), prefix-hit rate
(vLLM's prefix_cache_hits / queries over every replica's /metrics), bytes moved through the store,
failed requests. Scenarios: kill one replica, or the store, 40% of the way through.

The issue's workload is the default: 64 conversations x 6 turns, 8 system prompts of 2048 tokens.
On a small machine scale it down, e.g.
  .venv/bin/python bench/replicas_load.py --conversations 8 --turns 3 --system-prompts 2 \\
      --system-tokens 512 --replicas 1,2 --threads 1 --markdown
Prompts are text (the router's cache-aware policy matches request text); sizes are reported as the
servers count them (usage.prompt_tokens)."""
import argparse
import concurrent.futures as cf
import http.client
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts/replicas.sh"

WORDS = ("time year people way day man thing woman life child world school state family student group country "
         "problem hand part place case week company system program question work government number night point "
         "home water room mother area money story fact month lot right study book eye job word business issue "
         "side kind head house service friend father power hour game line end member law car city community name "
         "president team minute idea kid body information back parent face others level office door health person "
         "art war history party result change morning reason research girl guy moment air teacher force education").split()


def text_of(n_words, rng):
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r"^([^\s{]+)(\{[^}]*\})?\s+(\S+)$", line)
        if m and "_bucket" not in m.group(1):
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


def stream_completion(port, prompt, max_tokens, timeout=600):
    """(ttft seconds, total seconds, prompt tokens, completion tokens); raises on any failure."""
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
    t0 = time.time()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    ttft, text, usage = None, [], None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        ev = json.loads(data)
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev.get("choices", []):
            if ch.get("text"):
                if ttft is None:
                    ttft = time.time() - t0
                text.append(ch["text"])
    c.close()
    if usage is None:
        raise RuntimeError("stream ended without usage")
    return ttft if ttft is not None else time.time() - t0, time.time() - t0, usage["prompt_tokens"], \
        usage["completion_tokens"], "".join(text)


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def run_config(a, n, policy, store, scenario, run_dir):
    env = {**os.environ}
    up = [str(SCRIPT), "up", "-n", str(n), "--port", str(a.port), "--dir", str(run_dir), "--policy", policy,
          "--kv-cache", a.kv_cache, "--kv-budget", str(a.kv_budget), "--parallel", str(a.parallel)]
    if a.threads:
        up += ["--threads", str(a.threads)]
    if not store:
        up.append("--no-store")
    subprocess.run(up, check=True, env=env, stdout=subprocess.DEVNULL)
    try:
        ports = [a.port + 1 + i for i in range(n)]
        before = [metrics(p) for p in ports]
        rng = random.Random(a.seed)
        systems = [f"System {s}: you are assistant number {s}. " + text_of(int(a.system_tokens * 0.95), rng)
                   for s in range(a.system_prompts)]
        questions = [[f"Question {t} of conversation {c}: " + text_of(a.user_tokens, rng) for t in range(a.turns)]
                     for c in range(a.conversations)]
        lock = threading.Lock()
        rows, failures = [], []
        done = [0]
        total = a.conversations * a.turns
        killed = threading.Event()
        last = [None]

        def maybe_kill():
            with lock:
                done[0] += 1
                due = scenario != "none" and not killed.is_set() and done[0] >= 0.4 * total
                if due:
                    killed.set()
            if due:
                if scenario == "kill-replica":
                    last[0] = metrics(ports[0])  # its counters up to its end
                f = run_dir / ("replica-0.pid" if scenario == "kill-replica" else "redis.pid")
                if f.exists():
                    os.kill(int(f.read_text()), signal.SIGKILL)

        def conversation(c):
            history = systems[c % a.system_prompts]
            for t in range(a.turns):
                prompt = history + "\nUser: " + questions[c][t] + "\nAssistant:"
                try:
                    ttft, dt, pt, ct, text = stream_completion(a.port, prompt, a.max_tokens)
                    with lock:
                        rows.append((ttft, dt, pt, ct))
                    history = prompt + text
                except Exception as e:  # noqa: BLE001 (every failure is counted and shown)
                    with lock:
                        failures.append(str(e)[:200])
                    history = prompt
                maybe_kill()

        # Load balance: each replica's requests in flight, sampled; the share of the wall it had one or more
        # (a replica idle at the end while another still works costs aggregate throughput).
        busy, samples, sampling = [0] * n, [0], threading.Event()

        def sample():
            while not sampling.wait(0.25):
                for i, p in enumerate(ports):
                    try:
                        busy[i] += metrics(p).get("vllm:num_requests_running", 0) >= 1
                    except OSError:
                        pass
                samples[0] += 1

        t0 = time.time()
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        with cf.ThreadPoolExecutor(a.concurrency) as ex:
            list(ex.map(conversation, range(a.conversations)))
        wall = time.time() - t0
        sampling.set()
        sampler.join()
        after = [metrics(p) if not (scenario == "kill-replica" and i == 0) else (last[0] or before[0])
                 for i, p in enumerate(ports)]

        def delta(name):
            return sum(af.get(name, 0) - bf.get(name, 0) for af, bf in zip(after, before))

        q, h = delta("vllm:prefix_cache_queries_total"), delta("vllm:prefix_cache_hits_total")
        gen = sum(r[3] for r in rows)
        prompt_tokens = sum(r[2] for r in rows)
        return {
            "replicas": n, "policy": policy, "store": store, "scenario": scenario,
            "requests": len(rows), "failed": len(failures), "wall_s": wall,
            "gen_tok_s": gen / wall, "total_tok_s": (gen + prompt_tokens) / wall,
            "ttft_p50": pct([r[0] for r in rows], 0.5), "ttft_p99": pct([r[0] for r in rows], 0.99),
            "mean_prompt_tokens": prompt_tokens / max(1, len(rows)),
            "prefix_hit_rate": h / q if q else float("nan"),
            "store_bytes": delta("vq_prefix_store_fetched_bytes_total") + delta("vq_prefix_store_written_bytes_total"),
            "store_hits": delta("vq_prefix_store_hits_total"),
            # each replica's share of the generated tokens (load balance: the slowest replica sets the wall)
            "replica_gen_share": [round((af.get("vllm:generation_tokens_total", 0) -
                                         bf.get("vllm:generation_tokens_total", 0)) / max(1, gen), 3)
                                  for af, bf in zip(after, before)],
            "replica_busy": [round(b / max(1, samples[0]), 3) for b in busy],
            "failures": failures[:3],
        }
    finally:
        subprocess.run([str(SCRIPT), "down", "--dir", str(run_dir)], env=env, stdout=subprocess.DEVNULL)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversations", type=int, default=64)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--system-prompts", type=int, default=8)
    ap.add_argument("--system-tokens", type=int, default=2048, help="words of each system prompt (~tokens)")
    ap.add_argument("--user-tokens", type=int, default=48, help="words of each user turn")
    ap.add_argument("--max-tokens", type=int, default=32, help="tokens generated per turn")
    ap.add_argument("--concurrency", type=int, default=0, help="conversations at once (0: 4 per replica)")
    ap.add_argument("--replicas", default="1,2,4")
    ap.add_argument("--configs", default="cache_aware+store,cache_aware,round_robin+store,round_robin",
                    help="policy[+store] list")
    ap.add_argument("--scenarios", default="none", help="none,kill-replica,kill-store (kills at 40%% of the turns)")
    ap.add_argument("--kv-cache", default="vecinfer:d4b8")
    ap.add_argument("--kv-budget", type=int, default=1024)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0, help="threads per replica (0: the cores split evenly)")
    ap.add_argument("--port", type=int, default=18000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--run-dir", default=str(ROOT / ".replicas-bench"))
    ap.add_argument("--json", help="write every row here")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    a = ap.parse_args()
    for k in ("conversations", "turns", "system_prompts", "system_tokens", "max_tokens"):
        if getattr(a, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be >= 1")
    results = []
    for n in [int(x) for x in a.replicas.split(",")]:
        for cfg in a.configs.split(","):
            policy, _, st = cfg.partition("+")
            if st not in ("", "store"):
                ap.error(f"--configs: '{cfg}' is not POLICY or POLICY+store")
            if n == 1 and policy != a.configs.split(",")[0].partition("+")[0]:
                continue  # one replica: the policy does not matter
            for scenario in a.scenarios.split(","):
                if scenario == "kill-store" and not st:
                    continue
                if scenario == "kill-replica" and n == 1:
                    continue
                conc = a.concurrency or 4 * n
                a_conc = argparse.Namespace(**{**vars(a), "concurrency": conc})
                r = run_config(a_conc, n, policy, bool(st), scenario, Path(a.run_dir))
                results.append(r)
                print(json.dumps(r), file=sys.stderr, flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    if a.markdown:
        print("| replicas | routing | store | scenario | requests (failed) | gen tok/s | prompt+gen tok/s | "
              "TTFT p50 (s) | TTFT p99 (s) | prefix-hit rate | store MB moved | replicas busy (min / mean) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in results:
            print(f"| {r['replicas']} | {r['policy']} | {'yes' if r['store'] else 'no'} | {r['scenario']} | "
                  f"{r['requests']} ({r['failed']}) | {r['gen_tok_s']:.1f} | {r['total_tok_s']:.0f} | "
                  f"{r['ttft_p50']:.2f} | {r['ttft_p99']:.2f} | {r['prefix_hit_rate']:.3f} | "
                  f"{r['store_bytes'] / 1e6:.1f} | {min(r['replica_busy']):.2f} / "
                  f"{sum(r['replica_busy']) / len(r['replica_busy']):.2f} |")


if __name__ == "__main__":
    main()
