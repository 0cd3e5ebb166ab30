"""`veloxquant generate --save-session F` then `--load-session F` continues with exactly the tokens
an uninterrupted run gives (greedy), for a compressed cache; a session file made with another KV
cache, or a damaged one, is refused with one clear line. Skips when the default model is absent."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server_util import MODEL, VQ_BIN  # noqa: E402

pytestmark = pytest.mark.skipif(not MODEL.exists() or not Path(VQ_BIN).exists(),
                                reason=f"needs the default model ({MODEL}) and the veloxquant binary")
KV = "kivi4,r=32"
IDS = ",".join(str(1000 + 7 * i) for i in range(70))


def gen(tmp_path, name, *args, kv=KV):
    out = tmp_path / f"{name}.json"
    r = subprocess.run([VQ_BIN, "generate", "-m", str(MODEL), "--kv-cache", kv, "--temp", "0", "-t", "2", "-q",
                        "--ignore-eos", "--stats-json", str(out), *map(str, args)],
                       capture_output=True, text=True, timeout=300)
    return r, (json.loads(out.read_text()) if r.returncode == 0 else None)


def test_load_session_continues_exactly(tmp_path):
    r, whole = gen(tmp_path, "whole", "--prompt-ids", IDS, "-n", 30)
    assert r.returncode == 0, r.stderr
    steps = whole["decode_step_s"]  # one wall time per decode step, summing to decode_s
    assert len(steps) == whole["n_decoded"] == 29 and min(steps) > 0, steps
    assert abs(sum(steps) - whole["decode_s"]) < 1e-6 * max(1.0, whole["decode_s"]), (sum(steps), whole["decode_s"])
    sess = tmp_path / "s.vqkv"
    r, first = gen(tmp_path, "first", "--prompt-ids", IDS, "-n", 14, "--save-session", sess)
    assert r.returncode == 0, r.stderr
    r, rest = gen(tmp_path, "rest", "--load-session", sess, "-n", 16)
    assert r.returncode == 0, r.stderr
    assert first["tokens"] + rest["tokens"] == whole["tokens"]
    assert rest["n_prompt"] == 70 + 14, "the session's tokens come back as the prompt"

    r, _ = gen(tmp_path, "other", "--load-session", sess, "-n", 4, kv="q8_0")
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "made with KV cache kivi4" in r.stderr and str(sess) in r.stderr, r.stderr
    data = bytearray(sess.read_bytes())
    data[-20] ^= 1
    sess.write_bytes(bytes(data))
    r, _ = gen(tmp_path, "bad", "--load-session", sess, "-n", 4)
    assert r.returncode == 1 and "checksum mismatch" in r.stderr, r.stderr
