"""`veloxquant serve` as a hostile client or a careless operator would meet it (issue 26): API key
(flag, file, environment; 401 with an OpenAI error body; /health open), a loud warning when
listening beyond loopback without a key, CORS off by default and on with --allow-origin, 415 for
POSTs that are not application/json, no server paths in client errors, pipelined requests answered
in order, head and body deadlines (slowloris), connection caps, strict Content-Length, a flood of
1000 idle half-headers that does not starve normal clients, and a request that cannot fit the KV
budget refused with 400 before any streaming (counted as 400 in /metrics). Skips without the
default model. docs/RELIABILITY.md lists which promise each test holds."""
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_util import MODEL, VQ_BIN, Server  # noqa: E402

pytestmark = pytest.mark.skipif(not MODEL.exists() or not Path(VQ_BIN).exists(),
                                reason=f"needs the default model ({MODEL}) and the veloxquant binary")

BASE = ("--kv-cache", "q8_0", "--kv-budget", "64", "--parallel", "2")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Short deadlines and a small per-client cap, so the deadline and cap tests stay fast."""
    s = Server(*BASE, "--header-timeout", "2", "--body-timeout", "2", "--max-connections-per-client", "1200",
               session_dir=tmp_path_factory.mktemp("sessions"))
    yield s
    assert s.stop() == 0, "".join(s.log)


def raw(port, data, timeout=10, read_until_close=True, host="127.0.0.1"):
    """Sends bytes on a fresh connection and returns what comes back until the server closes it."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        while True:
            try:
                b = s.recv(65536)
            except socket.timeout:
                break
            if not b:
                break
            out += b
            if not read_until_close and b"\r\n\r\n" in out:
                break
        return out


def status_of(resp: bytes) -> int:
    m = re.match(rb"HTTP/1\.1 (\d{3}) ", resp)
    assert m, resp[:200]
    return int(m.group(1))


def responses(data: bytes):
    """Splits bytes holding several Content-Length responses into (status, body) pairs."""
    out = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        n = int(re.search(rb"Content-Length: (\d+)", head).group(1))
        out.append((status_of(head), rest[:n]))
        data = rest[n:]
    return out


# ---- 1. Security -------------------------------------------------------------------------------

def check_key(s, key):
    st, _, out = s.request("GET", "/v1/models")
    assert st == 401 and out["error"]["code"] == "invalid_api_key" and out["error"]["type"] == "invalid_request_error"
    assert "message" in out["error"]
    st, _, out = s.request("GET", "/v1/models", headers={"Authorization": "Bearer " + key + "x"})
    assert st == 401
    st, _, out = s.request("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 1},
                           headers={"Authorization": "Bearer wrong"})
    assert st == 401
    assert s.request("GET", "/v1/models", headers={"Authorization": "Bearer " + key})[0] == 200
    st, _, out = s.request("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2},
                           headers={"Authorization": "Bearer " + key})
    assert st == 200 and out["choices"][0]["text"] is not None
    assert s.request("GET", "/health")[0] == 200, "/health stays open"


def test_api_key_flag_file_and_env(tmp_path):
    s = Server(*BASE, "--api-key", "s3cret-1")
    try:
        check_key(s, "s3cret-1")
        # The openai client sends the key as a bearer token.
        c = s.client()
        c.api_key = "s3cret-1"
        assert c.models.list().data
    finally:
        assert s.stop() == 0
    f = tmp_path / "key"
    f.write_text("from-file-2\n")
    s = Server(*BASE, "--api-key-file", str(f))
    try:
        check_key(s, "from-file-2")
    finally:
        assert s.stop() == 0
    os.environ["VQ_API_KEY"] = "from-env-3"
    try:
        s = Server(*BASE)
    finally:
        del os.environ["VQ_API_KEY"]
    try:
        check_key(s, "from-env-3")
    finally:
        assert s.stop() == 0


def test_warns_when_listening_beyond_loopback_without_key():
    p = subprocess.Popen([VQ_BIN, "serve", "-m", str(MODEL), "--port", "0", "-t", "1", "--host", "0.0.0.0", *BASE],
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    log = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            line = p.stderr.readline()
            if not line:
                break
            log.append(line)
            if "listening on" in line:
                # The warning comes right after the listening line.
                for _ in range(3):
                    log.append(p.stderr.readline())
                break
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=60)
    text = "".join(log)
    assert "WARNING" in text and "WITHOUT an API key" in text, text


def test_cors_off_by_default(server):
    st, h, _ = server.request("GET", "/v1/models", headers={"Origin": "https://evil.example"})
    assert st == 200 and not any(k.lower().startswith("access-control-") for k in h), h
    st, h, _ = server.request("OPTIONS", "/v1/completions", headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert st == 405 and not any(k.lower().startswith("access-control-") for k in h), h


def test_cors_with_allow_origin():
    s = Server(*BASE, "--allow-origin", "https://app.example")
    try:
        st, h, _ = s.request("OPTIONS", "/v1/chat/completions", headers={
            "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert st == 204, (st, h)
        assert h["Access-Control-Allow-Origin"] == "https://app.example"
        assert "POST" in h["Access-Control-Allow-Methods"] and "Content-Type" in h["Access-Control-Allow-Headers"]
        st, h, _ = s.request("GET", "/v1/models", headers={"Origin": "https://app.example"})
        assert st == 200 and h["Access-Control-Allow-Origin"] == "https://app.example"
        st, h, _ = s.request("GET", "/v1/models", headers={"Origin": "https://other.example"})
        assert st == 200 and "Access-Control-Allow-Origin" not in h
    finally:
        assert s.stop() == 0


def test_post_without_json_content_type_is_415(server):
    body = json.dumps({"prompt": "hi", "max_tokens": 1})
    for ctype in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None]:
        hdr = f"Content-Type: {ctype}\r\n" if ctype else ""
        for path, b in [("/v1/completions", body), ("/v1/sessions/x/save", ""), ("/v1/sessions/x/restore", "")]:
            resp = raw(server.port, f"POST {path} HTTP/1.1\r\nHost: x\r\n{hdr}Content-Length: {len(b)}\r\n"
                                    f"Connection: close\r\n\r\n{b}".encode())
            assert status_of(resp) == 415, (path, ctype, resp[:300])
    # application/json with a charset is fine.
    st, _, _ = server.request("POST", "/v1/completions", body, headers={"Content-Type": "application/json; charset=utf-8"})
    assert st == 200


def test_session_errors_do_not_show_server_paths(server, tmp_path):
    sdir = Path(server.proc.args[server.proc.args.index("--session-dir") + 1])
    (sdir / "broken.vqkv").write_bytes(b"not a session file at all" * 10)
    st, _, out = server.request("POST", "/v1/sessions/broken/restore", {})
    assert 400 <= st < 600 and st != 404, (st, out)
    msg = out["error"]["message"]
    assert str(sdir) not in msg and not re.search(r"(^|[\s'\"(])/\w+/", msg), msg


# ---- 2. HTTP robustness ------------------------------------------------------------------------

def test_pipelined_requests_answered_in_order(server):
    body = json.dumps({"prompt": "Say one word.", "max_tokens": 2, "temperature": 0})
    data = (b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
            + f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
            + b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
            + b"GET /nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    got = responses(raw(server.port, data))
    assert [st for st, _ in got] == [200, 200, 200, 404], got
    assert json.loads(got[0][1])["status"] == "ok"
    assert json.loads(got[1][1])["object"] == "text_completion"
    assert json.loads(got[2][1])["object"] == "list"


def test_strict_content_length(server):
    def post(headers, body=b"{}"):
        return status_of(raw(server.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                          + headers + b"Connection: close\r\n\r\n" + body))
    assert post(b"Content-Length: -1\r\n") == 400
    assert post(b"Content-Length: abc\r\n") == 400
    assert post(b"Content-Length: +2\r\n") == 400
    assert post(b"Content-Length: 2, 2\r\n") == 400
    assert post(b"Content-Length: 2\r\nContent-Length: 2\r\n") == 400
    assert post(b"Content-Length: 2\r\nContent-Length: 5\r\n") == 400
    assert post(b"Transfer-Encoding: chunked\r\n", b"2\r\n{}\r\n0\r\n\r\n") == 411
    assert post(b"Content-Length: 99999999999\r\n") == 413
    assert server.request("GET", "/health")[0] == 200


def test_slowloris_head_is_cut_by_a_total_deadline(server):
    """One header line every 0.4 s: the 2 s head deadline ends it with 408 (per-read timeouts would not)."""
    t0 = time.time()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\n")
        out = b""
        for i in range(40):
            try:
                s.sendall(f"X-Slow-{i}: 1\r\n".encode())
            except OSError:
                break
            s.settimeout(0.4)
            try:
                b = s.recv(4096)
                if not b:
                    break
                out += b
            except socket.timeout:
                pass
            except OSError:  # reset: the server closed while we were still sending
                break
        elapsed = time.time() - t0
    assert elapsed < 6, elapsed
    assert out == b"" or status_of(out) == 408, out


def test_slow_body_is_cut_by_a_deadline(server):
    t0 = time.time()
    out = raw(server.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: 100\r\n\r\n{\"pro", timeout=10)
    assert status_of(out) == 408 and time.time() - t0 < 6


def test_connection_cap_per_client():
    s = Server(*BASE, "--max-connections-per-client", "4", "--max-connections", "6")
    try:
        held = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(4)]
        time.sleep(0.3)
        # Refused at accept: 503 and close, before the client sends anything.
        out = raw(s.port, b"", timeout=5)
        assert status_of(out) == 503 and b"your address" in out, out
        # Another address (127.0.0.2 is loopback too) still gets in, up to the total cap.
        other = socket.create_connection(("127.0.0.1", s.port), source_address=("127.0.0.2", 0), timeout=10)
        other.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status_of(other.recv(4096)) == 200
        held.append(other)
        held.append(socket.create_connection(("127.0.0.1", s.port), source_address=("127.0.0.2", 0)))
        time.sleep(0.3)
        out = raw(s.port, b"", timeout=5, host="127.0.0.1")
        assert status_of(out) == 503 and b"to the server" in out, out
        for h in held:
            h.close()
        time.sleep(0.3)
        assert s.request("GET", "/health")[0] == 200
    finally:
        assert s.stop() == 0


def test_listen_backlog_is_large(server):
    out = subprocess.run(["ss", "-ltnH", f"sport = :{server.port}"], capture_output=True, text=True).stdout
    backlog = int(out.split()[2])
    assert backlog >= 128, out


def test_flood_of_idle_half_headers_does_not_starve_clients(server):
    """1000 sockets each holding a partial header; normal requests must still be answered within 1 s.
    (The figures go to docs/RELIABILITY.md: printed with -s.)"""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    flood = []
    try:
        for i in range(1000):
            c = socket.socket()
            c.setblocking(True)
            c.connect(("127.0.0.1", server.port))
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
            flood.append(c)
        worst = 0.0
        for i in range(20):
            t0 = time.time()
            st, _, _ = server.request("GET", "/health")
            worst = max(worst, time.time() - t0)
            assert st == 200
        t0 = time.time()
        st, _, out = server.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 1})
        gen = time.time() - t0
        assert st == 200, out
        print(f"\nflood: 1000 idle half-headers held; worst /health of 20: {worst * 1000:.1f} ms; "
              f"a 1-token completion: {gen * 1000:.1f} ms")
        assert worst < 1.0 and gen < 1.0 + 1.0, (worst, gen)
    finally:
        for c in flood:
            c.close()
    # And the deadline closed them: their slots came back.
    assert server.request("GET", "/health")[0] == 200


# ---- 4. Budget -------------------------------------------------------------------------------

def test_request_past_the_budget_is_400_before_streaming():
    s = Server("--kv-cache", "fp16", "--kv-budget", "1", "--parallel", "1")
    try:
        body = {"prompt": "Tell me a story.", "max_tokens": 500, "stream": True}
        resp = raw(s.port, (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            f"Content-Length: {len(json.dumps(body))}\r\nConnection: close\r\n\r\n"
                            f"{json.dumps(body)}").encode())
        assert status_of(resp) == 400, resp[:400]
        err = json.loads(resp.split(b"\r\n\r\n", 1)[1])["error"]
        assert "KV budget" in err["message"] and err["param"] == "max_tokens", err
        st, _, out = s.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 3})
        assert st == 200, out
        _, _, text = s.request("GET", "/metrics")
        assert 'vq_requests_total{endpoint="/v1/completions",status="400"} 1' in text, text
    finally:
        assert s.stop() == 0


def test_bad_server_flags_refused_before_the_model(tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    cases = [(["--api-key", "a", "--api-key-file", str(empty)], "give one of them"),
             (["--api-key-file", str(tmp_path / "missing")], "--api-key-file: cannot read"),
             (["--api-key-file", str(empty)], "holds no key"),
             (["--api-key", "has space"], "printable ASCII"),
             (["--header-timeout", "0"], "--header-timeout"),
             (["--body-timeout", "-1"], "--body-timeout"),
             (["--max-connections", "0"], "--max-connections"),
             (["--max-connections-per-client", "0"], "--max-connections-per-client")]
    for args, needle in cases:
        r = subprocess.run([VQ_BIN, "serve", "-m", str(tmp_path / "no-such-model.gguf"), *args],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and needle in r.stderr and "no-such-model" not in r.stderr, (args, r.stderr)
