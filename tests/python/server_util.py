"""Starts `veloxquant serve` on a free loopback port for the server tests and stops it with SIGTERM
(the exit code must be 0). Raw HTTP helpers for what the openai client does not send."""
import http.client
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL = Path(os.environ.get("VQ_SMOLLM2_GGUF",
                            Path.home() / ".cache/veloxquant/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
VQ_BIN = os.environ.get("VQ_BIN", str(ROOT / "build/release/tools/veloxquant/veloxquant"))


class Server:
    def __init__(self, *args, session_dir=None):
        cmd = [VQ_BIN, "serve", "-m", str(MODEL), "--port", "0", "-t", "2", *map(str, args)]
        if session_dir is not None:
            cmd += ["--session-dir", str(session_dir)]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self.log = []
        self.port = None
        deadline = time.time() + 180
        while self.port is None:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError(f"server exited ({self.proc.wait()}): {''.join(self.log)}")
            self.log.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
            if time.time() > deadline:
                raise RuntimeError("server did not start: " + "".join(self.log))
        # Keep reading stderr so the server never blocks on a full pipe.
        self._drain = threading.Thread(target=self._read_rest, daemon=True)
        self._drain.start()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def _read_rest(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def client(self):
        from openai import OpenAI
        return OpenAI(base_url=self.base_url, api_key="unused", max_retries=0, timeout=120)

    def request(self, method, path, body=None, headers=None):
        """(status, headers, parsed JSON or text) of one raw request; body: bytes, str or JSON."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        data = r.read()
        conn.close()
        try:
            payload = json.loads(data)
        except ValueError:
            payload = data.decode("utf-8", "replace")
        return r.status, dict(r.getheaders()), payload

    def metric(self, name):
        """The value of an unlabelled metric in /metrics."""
        _, _, text = self.request("GET", "/metrics")
        m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        assert m, f"{name} not in /metrics"
        return float(m.group(1))

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.proc.wait(timeout=timeout)
        self._drain.join(timeout=5)
        return rc
