"""The multi-replica deployment (issue 24): scripts/replicas.sh brings up 2 replicas of `veloxquant
serve` + redis-server (the shared prefix store) + SGLang's router (sglang-router from PyPI, cache-aware
policy); requests through the router (completions, chat, streaming) are answered, both replicas
registered through the endpoints the router asks (/model_info, /server_info), a replica killed
mid-run loses no request the router can retry, and `down` stops every process. Also the SGLang
fields the router forwards: accepted at what this server does, refused otherwise."""
import concurrent.futures as cf
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_util import MODEL, ROOT, VQ_BIN, Server  # noqa: E402

try:
    import sglang_router  # noqa: F401
    HAVE_ROUTER = True
except ImportError:
    HAVE_ROUTER = False

pytestmark = pytest.mark.skipif(not MODEL.exists() or not Path(VQ_BIN).exists(),
                                reason="needs the default model and the veloxquant binary")


def free_port_block(n):
    """A base port with base..base+100 free enough for the script (router, replicas, redis)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + 101 > 65535:
            continue
        ok = True
        for p in [base + i for i in range(n + 1)] + [base + 100]:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port block")


def post(url, body, timeout=120):
    q = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(q, timeout=timeout) as r:
        return r.status, r.read()


def get(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.status, r.read().decode()


def test_router_fields_and_endpoints():
    s = Server("--kv-cache", "kivi4", "--parallel", "2", "--kv-budget", "64")
    try:
        st, _, info = s.request("GET", "/get_model_info")
        assert st == 200 and info["is_generation"] is True and info["model_path"] == MODEL.name[:-5]
        st, _, info = s.request("GET", "/server_info")
        assert st == 200 and info["dp_size"] == 1 and info["max_running_requests"] == 2
        assert s.request("POST", "/model_info", {})[0] == 405
        # What sglang-router adds to a chat request, verbatim (max_tokens renamed as it does).
        body = {"messages": [{"role": "user", "content": "Hi"}], "model": "m", "logprobs": False,
                "max_completion_tokens": 4, "stream": False, "no_stop_trim": False, "ignore_eos": False,
                "continue_final_message": False, "skip_special_tokens": True, "separate_reasoning": True,
                "stream_reasoning": True, "return_hidden_states": False}
        st, _, r = s.request("POST", "/v1/chat/completions", body)
        assert st == 200 and r["usage"]["completion_tokens"] == 4
        st, _, r = s.request("POST", "/v1/completions", {"model": "m", "prompt": "Hi", "max_tokens": 2, "echo": False,
                                                         "no_stop_trim": False, "skip_special_tokens": True,
                                                         "return_hidden_states": False})
        assert st == 200
        for k, v in [("no_stop_trim", True), ("skip_special_tokens", False), ("return_hidden_states", True),
                     ("continue_final_message", True), ("separate_reasoning", "yes")]:
            st, _, r = s.request("POST", "/v1/chat/completions", {**body, k: v})
            assert st == 400 and r["error"]["param"] == k, (k, r)
        st, _, r = s.request("POST", "/v1/completions", {"model": "m", "prompt": "Hi", "separate_reasoning": True})
        assert st == 400 and "unknown field" in r["error"]["message"], "a chat-only field on completions"
    finally:
        assert s.stop() == 0


@pytest.mark.skipif(not HAVE_ROUTER or not shutil.which("redis-server"), reason="needs sglang-router and redis-server")
def test_script_up_route_kill_a_replica_down(tmp_path):
    base = free_port_block(2)
    run = tmp_path / "run"
    env = {**os.environ, "VQ_BIN": VQ_BIN}
    script = str(ROOT / "scripts/replicas.sh")
    up = subprocess.run([script, "up", "-n", "2", "--port", str(base), "--dir", str(run), "--threads", "1",
                         "--kv-cache", "kivi4", "--kv-budget", "64", "--parallel", "2"],
                        env=env, capture_output=True, text=True, timeout=180)
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        router = f"http://127.0.0.1:{base}"
        st, r = post(router + "/v1/chat/completions",
                     {"model": "m", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 6})
        assert st == 200 and json.loads(r)["usage"]["completion_tokens"] == 6
        for i in range(2):  # both registered through the endpoints the router asks
            m = get(f"http://127.0.0.1:{base + 1 + i}/metrics")[1]
            assert 'vq_requests_total{endpoint="/model_info",status="200"}' in m
        # Kill replica 0 while requests run: every request still gets its answer.
        prompts = [f"Count to {i}:" for i in range(12)]
        with cf.ThreadPoolExecutor(4) as ex:
            futs = [ex.submit(post, router + "/v1/completions", {"model": "m", "prompt": p, "max_tokens": 8})
                    for p in prompts]
            time.sleep(0.3)
            os.kill(int((run / "replica-0.pid").read_text()), signal.SIGKILL)
            assert all(f.result()[0] == 200 for f in futs)
        for p in prompts[:4]:
            assert post(router + "/v1/completions", {"model": "m", "prompt": p, "max_tokens": 4})[0] == 200
    finally:
        down = subprocess.run([script, "down", "--dir", str(run)], env=env, capture_output=True, text=True, timeout=120)
        assert down.returncode == 0, down.stderr
    for f in ("router", "replica-1", "redis"):
        assert not (run / f"{f}.pid").exists(), f"{f} left behind"


@pytest.mark.parametrize("args,msg", [
    (["--kv-events", "foo"], "--kv-events: 'foo' is not a ZMQ endpoint"),
    (["--kv-events-replay", "tcp://127.0.0.1:5"], "--kv-events-replay needs --kv-events"),
    (["--kv-events", "tcp://*:5", "--no-prefix-cache"], "--no-prefix-cache has none"),
    (["--prefix-store", "http://x"], "--prefix-store: 'http://x' is not redis://HOST[:PORT]"),
    (["--prefix-store", "redis://h:99999"], "the port must be in 1..65535"),
    (["--prefix-store", "redis://u:p@h:1"], "no user, password or database"),
])
def test_bad_replica_flags_refused_before_the_model(args, msg):
    r = subprocess.run([VQ_BIN, "serve", "-m", "/nonexistent.gguf", *args], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and msg in r.stderr, r.stderr
    assert "nonexistent" not in r.stderr, "refused before the model is looked at"
