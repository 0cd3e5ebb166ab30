"""Issue 26: the CLI checks every flag against the model before the work starts, and refuses
session files that are not regular files. Each case ends with exit code 1 and one line on stderr
naming the flag (or gives a warning and runs, with --allow-longer-context). The tiny model has a
trained context of 512 tokens. Cases with NO_MODEL must be refused before the model loads."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.reference.bad_inputs import calibration_bytes  # noqa: E402
from tests.reference.tiny_models import write_tiny  # noqa: E402

VQ_BIN = os.environ.get("VQ_BIN", str(ROOT / "build/release/tools/veloxquant/veloxquant"))
NO_MODEL = "/nonexistent/dir/model.gguf"


def run(*args, timeout=60):
    r = subprocess.run([VQ_BIN, *map(str, args)], capture_output=True, timeout=timeout)
    return r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")


def refused(*args, needles=()):
    rc, _, err = run(*args)
    assert rc == 1, f"exit code {rc}, stderr {err!r}"
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("veloxquant: error: "), err
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"
    return lines[0]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny26")
    model = d / "tiny.gguf"
    write_tiny(model)
    return model


def ids(n):
    return ",".join(str(1 + i % 90) for i in range(n))


def test_context_past_the_trained_one_is_an_error_unless_allowed(tiny):
    refused("generate", "-m", tiny, "--prompt-ids", "1,2,3", "-n", "2", "-q", "-c", "10000",
            needles=["-c: 10000 tokens", "trained context of 512", "--allow-longer-context"])
    rc, _, err = run("generate", "-m", tiny, "--prompt-ids", "1,2,3", "-n", "2", "-q", "-c", "600",
                     "--allow-longer-context")
    assert rc == 0, err
    assert "warning: -c: 600 tokens, past the model's trained context of 512" in err, err
    refused("generate", "-m", NO_MODEL, "--prompt-ids", "1,2,3", "-c", "100000000",
            needles=["-c: 100000000 must be in"])


def test_prompt_and_n_predict_are_bounded_by_the_context(tiny):
    refused("generate", "-m", tiny, "--prompt-ids", ids(600), "-n", "2", "-q",
            needles=["the prompt of 600 tokens", "trained context of 512"])
    refused("generate", "-m", tiny, "--prompt-ids", "1,2,3", "-n", "600", "-q",
            needles=["-n 600", "trained context of 512"])
    refused("generate", "-m", NO_MODEL, "--prompt-ids", "1,2,3", "-n", "100000000",
            needles=["-n: 100000000 must be in"])
    refused("generate", "-m", NO_MODEL, "--prompt-ids", "1,2,3", "-n", "20", "-c", "10",
            needles=["-n: 20 new tokens cannot fit the context of 10"])
    rc, _, err = run("generate", "-m", tiny, "--prompt-ids", ids(600), "-n", "2", "-q", "--allow-longer-context")
    assert rc == 0 and "warning:" in err, err


def test_kv_budget_too_small_names_the_flag(tiny):
    refused("generate", "-m", tiny, "--prompt-ids", "1,2,3", "-n", "2", "-q", "--kv-budget", "0.001",
            needles=["--kv-budget: 0.001 MiB", "cannot hold one block per layer"])


def test_serve_flags_are_refused_before_the_model(tmp_path):
    refused("serve", "-m", NO_MODEL, "--shutdown-grace", "-1", needles=["--shutdown-grace: -1"])
    refused("serve", "-m", NO_MODEL, "--max-sessions", "0", needles=["--max-sessions: 0"])
    refused("serve", "-m", NO_MODEL, "-c", "100000000", needles=["-c: 100000000"])
    f = tmp_path / "file"
    f.write_text("x")
    refused("serve", "-m", NO_MODEL, "--session-dir", f, needles=["--session-dir", "is not a directory"])
    refused("serve", "-m", NO_MODEL, "--session-dir", tmp_path / "missing", needles=["--session-dir", "does not exist"])


def test_serve_context_past_the_trained_one(tmp_path):
    model = tmp_path / "vocab.gguf"
    write_tiny(model, n_vocab=300, vocab=True)  # serve needs a tokenizer
    refused("serve", "-m", model, "-c", "100000", "--port", "0", needles=["-c: 100000 tokens", "trained context"])


def test_output_paths_are_checked_before_the_work(tmp_path):
    refused("eval", "-m", NO_MODEL, "-o", tmp_path / "missing" / "out.json", needles=["-o", "does not exist"])
    refused("eval", "-m", NO_MODEL, "--save-inputs", tmp_path, needles=["--save-inputs", "directory"])
    refused("generate", "-m", NO_MODEL, "--prompt-ids", "1", "--save-session", tmp_path / "no" / "s.vqkv",
            needles=["--save-session", "does not exist"])


def test_eval_device_flag_is_checked_before_the_model_loads():
    # No usable GPU: one line naming --device cuda before the model is read; with one, the missing
    # model is the one line.
    line = refused("eval", "-m", NO_MODEL, "--device", "cuda")
    assert "--device cuda" in line or NO_MODEL in line, line
    refused("eval", "-m", NO_MODEL, "--device", "tpu", needles=["--device", "tpu"])


def test_load_session_takes_regular_files_only(tiny, tmp_path):
    d = tmp_path / "x.vqkv"
    d.mkdir()
    link = tmp_path / "link.vqkv"
    real = tmp_path / "real.vqkv"
    real.write_bytes(b"VQKVSES\0" + b"\0" * 200)
    link.symlink_to(real)
    # Before the model loads (/dev/zero used to hang reading forever).
    refused("generate", "-m", NO_MODEL, "--load-session", "/dev/zero", "-n", "1",
            needles=["--load-session '/dev/zero'", "not a regular file"])
    refused("generate", "-m", NO_MODEL, "--load-session", d, "-n", "1", needles=["is a directory"])
    refused("generate", "-m", NO_MODEL, "--load-session", link, "-n", "1", needles=["symbolic link"])
    # The contents: a bad file is refused by the reader naming it.
    refused("generate", "-m", tiny, "--load-session", real, "-n", "1", needles=[str(real), "session file version 0"])


def test_calibration_of_another_model_is_refused(tiny, tmp_path):
    ok = tmp_path / "ok.vqcal"
    ok.write_bytes(calibration_bytes(2, 2, 16)[0])  # records model "tiny": this one (tiny.gguf)
    rc, _, err = run("generate", "-m", tiny, "--prompt-ids", "1,2,3", "-n", "2", "-q", "--kv-cache", "vecinfer:d4b8",
                     "--calib", ok)
    assert rc == 0, err
    other = tmp_path / "other.vqcal"
    other.write_bytes(calibration_bytes(2, 2, 16, model=b"Llama-3-8B.gguf")[0])  # same geometry, other model
    refused("generate", "-m", tiny, "--prompt-ids", "1,2,3", "-n", "2", "-q", "--kv-cache", "vecinfer:d4b8",
            "--calib", other, needles=[str(other), "made for model 'Llama-3-8B.gguf'", "tiny.gguf"])


def test_messages_are_not_cut_at_an_embedded_nul(tmp_path):
    p = tmp_path / "nul.gguf"
    write_tiny(p, arch="lla\0ma")
    line = refused("info", p)
    assert "lla\\0ma" in line, line


def test_server_refuses_forged_and_non_regular_session_files(tmp_path):
    """The server's restore: a file with a NaN and a recomputed SHA-256 (was HTTP 200 with empty
    text), a directory named x.vqkv (was 500) and a symbolic link (was followed) get 422 naming the
    cause; a temporary of an interrupted save (its process gone) is removed at start."""
    import hashlib
    import struct
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from server_util import MODEL, Server
    assert MODEL.exists(), f"the default model is missing at {MODEL}: run scripts/setup.sh"
    sdir = tmp_path / "sessions"
    sdir.mkdir()
    stale = sdir / "old.vqkv.tmp.999999999.0"  # no such pid
    stale.write_bytes(b"partial")
    s = Server("--kv-cache", "fp16", "--kv-budget", "64", session_dir=sdir)
    try:
        assert not stale.exists(), "the temporary of an interrupted save was kept"
        c = s.client()
        c.completions.create(model="m", prompt=list(range(1000, 1040)), max_tokens=4, temperature=0,
                             extra_body={"session": "a"})
        assert s.request("POST", "/v1/sessions/a/save")[0] == 200
        good = (sdir / "a.vqkv").read_bytes()
        forged = bytearray(good)
        struct.pack_into("<H", forged, len(forged) - 34, 0x7E00)  # the last dense value: NaN
        forged[-32:] = hashlib.sha256(bytes(forged[:-32])).digest()
        (sdir / "nan.vqkv").write_bytes(bytes(forged))
        (sdir / "dir.vqkv").mkdir()
        (sdir / "link.vqkv").symlink_to(sdir / "a.vqkv")
        for name, words in [("nan", "non-finite"), ("dir", "is a directory"), ("link", "symbolic link")]:
            st, _, body = s.request("POST", f"/v1/sessions/{name}/restore")
            assert st == 422 and words in body["error"]["message"], (name, st, body)
        assert s.request("POST", "/v1/sessions/a/restore")[0] == 200  # the control
    finally:
        assert s.stop() == 0, "".join(s.log)
