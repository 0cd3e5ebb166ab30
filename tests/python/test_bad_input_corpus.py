"""The bad-input corpus: every kind of bad input the CLI can meet, each run through the
veloxquant binary. Every case must end with exit code 1 (not a signal, not 0), exactly one line
on stderr ("veloxquant: error: ...") that names the fault, no control character from the input
on the terminal, and no output file (or temporary) left behind. Cases marked "before the model"
give a model path that does not exist: the fault must be reported first, i.e. found before any
expensive work. docs/RELIABILITY.md lists the cases and their outcomes."""
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.reference.bad_inputs import calibration_bytes, poke, tensor_fields, with_float  # noqa: E402
from tests.reference.tiny_models import write_tiny  # noqa: E402

VQ_BIN = os.environ.get("VQ_BIN", str(ROOT / "build/release/tools/veloxquant/veloxquant"))
SMOLLM2 = Path(os.environ.get("VQ_SMOLLM2_GGUF",
                              Path.home() / ".cache/veloxquant/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
NO_MODEL = "/nonexistent/dir/model.gguf"  # reaching the model load means the check came too late
IDS = ["--prompt-ids", "1,2,3", "-n", "2", "-q"]


def run(*args):
    r = subprocess.run([VQ_BIN, *map(str, args)], capture_output=True, timeout=120)
    return r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")


def expect_refused(args, *needles, outputs=()):
    rc, _, err = run(*args)
    assert rc == 1, f"exit code {rc} (negative: a signal), stderr {err!r}"
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}: {err!r}"
    assert lines[0].startswith("veloxquant: error: "), lines[0]
    print(f"[refused] {' '.join(map(str, args))[:100]}\n          -> {lines[0]}")  # shown with pytest -s
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"
    assert "\x1b" not in err and "\x07" not in err, f"raw control characters reached stderr: {err!r}"
    for out in outputs:
        out = Path(out)
        assert not out.exists(), f"{out} was left behind"
        if out.parent.exists():
            left = [p.name for p in out.parent.iterdir() if p.name.startswith(out.name + ".tmp")]
            assert not left, f"temporaries left behind: {left}"
    return lines[0]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny float32 llama model (2 layers, 2 KV heads of 16) and a valid calibration for it."""
    d = tmp_path_factory.mktemp("tiny")
    model = d / "tiny.gguf"
    write_tiny(model)
    calib = d / "tiny_d4b8.vqcal"
    data, where = calibration_bytes(2, 2, 16)
    calib.write_bytes(data)
    return model, calib, data, where


def test_the_valid_inputs_work(tiny, tmp_path):
    """The control: the inputs the cases below corrupt are accepted as they are."""
    model, calib, _, _ = tiny
    out = tmp_path / "stats.json"
    rc, _, err = run("generate", "-m", model, *IDS, "--kv-cache", "vecinfer:d4b8", "--calib", calib,
                     "--stats-json", out)
    assert rc == 0, err
    assert out.exists()


# ---------------------------------------------------------------- GGUF files
def gguf_case(tiny, tmp_path, edit):
    p = tmp_path / "bad.gguf"
    p.write_bytes(tiny[0].read_bytes())
    edit(p)
    return p


GGUF_CASES = {
    # name: (edit of the tiny model, needles)
    "empty": (lambda p: p.write_bytes(b""), ["truncated file"]),
    "wrong magic": (lambda p: poke(p, 0, "<4s", b"GGML"), ["not a GGUF file"]),
    "version 99": (lambda p: poke(p, 4, "<I", 99), ["unsupported GGUF version 99"]),
    "big-endian": (lambda p: poke(p, 4, ">I", 3), ["big-endian GGUF"]),
    "truncated header": (lambda p: p.write_bytes(p.read_bytes()[:20]), ["truncated file", "header kv_count"]),
    "truncated tensor data": (lambda p: p.write_bytes(p.read_bytes()[:-1]), ["lies outside the file"]),
    "huge kv count": (lambda p: poke(p, 16, "<Q", 1 << 60), ["kv_count", "cannot fit"]),
    "huge tensor count": (lambda p: poke(p, 8, "<Q", 1 << 60), ["tensor_count", "cannot fit"]),
    "type byte f32 -> f16": (lambda p: poke(p, tensor_fields(p, "blk.0.attn_q.weight")[0], "<I", 1),
                             ["unused bytes", "blk.0.attn_q.weight", "does not match"]),
    "type byte f32 -> q8_0": (lambda p: poke(p, tensor_fields(p, "blk.1.ffn_up.weight")[0], "<I", 8),
                              ["blk.1.ffn_up.weight", "q8_0"]),
    "unknown type id": (lambda p: poke(p, tensor_fields(p, "blk.0.attn_k.weight")[0], "<I", 200),
                        ["'blk.0.attn_k.weight' type", "unknown tensor type id 200"]),
    "overlapping offsets": (lambda p: poke(p, tensor_fields(p, "blk.0.attn_v.weight")[1], "<Q",
                                           struct.unpack_from("<Q", p.read_bytes(),
                                                              tensor_fields(p, "blk.0.attn_k.weight")[1])[0]),
                            ["overlaps", "blk.0.attn_v.weight", "blk.0.attn_k.weight"]),
    "misaligned offset": (lambda p: poke(p, tensor_fields(p, "output_norm.weight")[1], "<Q", 4),
                          ["offset", "not a multiple of the alignment"]),
    "huge dimension": (lambda p: poke(p, tensor_fields(p, "output_norm.weight")[0] - 8, "<Q", 1 << 40),
                       ["output_norm.weight"]),
}


@pytest.mark.parametrize("case", sorted(GGUF_CASES))
def test_bad_gguf(tiny, tmp_path, case):
    edit, needles = GGUF_CASES[case]
    p = gguf_case(tiny, tmp_path, edit)
    expect_refused(["info", p], str(p), *needles)
    expect_refused(["generate", "-m", p, *IDS], str(p), *needles)


def test_non_finite_weights(tiny, tmp_path):
    """A NaN or inf weight: before, the attention's softmax hid it from the logits and generation
    printed garbage with exit 0. Now every command that runs the model refuses it after the load."""
    import gguf
    for value, in_model in ((float("nan"), tiny[0]), (float("inf"), tiny[0])):
        p = tmp_path / "nan.gguf"
        p.write_bytes(in_model.read_bytes())
        t = next(t for t in gguf.GGUFReader(str(p)).tensors if t.name == "blk.0.attn_q.weight")
        poke(p, t.data_offset + 4 * 5, "<f", value)
        expect_refused(["generate", "-m", p, *IDS], str(p), "'blk.0.attn_q.weight' (f32) holds a NaN or inf value at element 5")
    if not SMOLLM2.exists():
        pytest.fail(f"default model missing at {SMOLLM2}: run scripts/setup.sh")
    p.write_bytes(SMOLLM2.read_bytes())
    t = next(t for t in gguf.GGUFReader(str(p)).tensors if t.name == "blk.2.attn_v.weight")
    poke(p, t.data_offset + 20 * 3 + 2, "<H", 0x7C00)  # the min (m) of block 3 of a q4_1 tensor: +inf
    expect_refused(["generate", "-m", p, "-p", "hi", "-n", "1", "-q"], "'blk.2.attn_v.weight' (q4_1) holds a NaN or inf block scale at element 96")
    text = tmp_path / "t.txt"
    text.write_text("Some text to score. " * 20)
    expect_refused(["perplexity", "-m", p, "--text", text], "holds a NaN or inf")


def test_missing_and_directory_model(tmp_path):
    expect_refused(["info", tmp_path / "none.gguf"], str(tmp_path / "none.gguf"), "cannot open")
    expect_refused(["generate", "-m", tmp_path, *IDS], str(tmp_path), "not a regular file")


def test_changed_type_byte_of_the_real_model(tmp_path):
    """A Q4_1 tensor of SmolLM2 relabelled Q4_0 (smaller) and Q8_0 (larger): before, both
    loaded and generated garbage with exit 0."""
    if not SMOLLM2.exists():
        pytest.fail(f"default model missing at {SMOLLM2}: run scripts/setup.sh")
    p = tmp_path / "smol.gguf"
    for new_type, needle in ((2, "unused bytes"), (8, "overlaps")):
        p.write_bytes(SMOLLM2.read_bytes())
        poke(p, tensor_fields(p, "blk.3.ffn_gate.weight")[0], "<I", new_type)
        expect_refused(["generate", "-m", p, "-p", "hi", "-n", "1", "-q"], str(p), needle, "blk.3.ffn_gate.weight")


# ---------------------------------------------------------------- calibration files
def calib_case(tiny, tmp_path, make):
    p = tmp_path / "bad.vqcal"
    _, _, data, where = tiny
    p.write_bytes(make(data, where))
    return p


CALIB_CASES = {
    "empty": (lambda d, w: b"", ["truncated"]),
    "wrong magic": (lambda d, w: b"VQCALIX\0" + d[8:], ["bad magic"]),
    "version 5": (lambda d, w: d[:8] + struct.pack("<I", 5) + d[12:], ["version 5 is not supported"]),
    "truncated": (lambda d, w: d[:-100], ["truncated"]),
    "trailing bytes": (lambda d, w: d + b"\0", ["trailing bytes"]),
    "flipped payload byte": (lambda d, w: with_float(d, w["key"][1], 0.25, fix_checksum=False),
                             ["checksum mismatch"]),
    "huge codebook value (valid checksum)": (lambda d, w: with_float(d, w["key"][0] + 40, 1e30),
                                             ["layer 0 key codebooks[0, 0, 2, 2] = 1e+30", "65504"]),
    "NaN codebook value (valid checksum)": (lambda d, w: with_float(d, w["value"][1], float("nan")),
                                            ["layer 1 value codebooks[0, 0, 0, 0] = nan"]),
    "infinite smoothing (valid checksum)": (lambda d, w: with_float(d, w["smoothing"][0] + 4, float("inf")),
                                            ["layer 0 smoothing[0, 1] = inf"]),
    "zero smoothing (valid checksum)": (lambda d, w: with_float(d, w["smoothing"][1], 0.0),
                                        ["layer 1 smoothing[0, 0] = 0 must be in [0.001, 65504]"]),
    "huge header dims": (lambda d, w: d[:16] + struct.pack("<I", 4096) * 3 + d[28:], ["inconsistent header"]),
    "huge n_layers": (lambda d, w: d[:16] + struct.pack("<I", 4096) + d[20:], ["truncated", "the header implies"]),
}


@pytest.mark.parametrize("case", sorted(CALIB_CASES))
def test_bad_calibration_file(tiny, tmp_path, case):
    make, needles = CALIB_CASES[case]
    p = calib_case(tiny, tmp_path, make)
    expect_refused(["generate", "-m", tiny[0], *IDS, "--kv-cache", "vecinfer:d4b8", "--calib", p], str(p), *needles)


@pytest.mark.parametrize("spec,data_args,needles", [
    ("vecinfer:d4b8,gran=shared", {}, ["granularity is per_subspace but the cache spec says gran=shared"]),
    ("vecinfer:d4b8", {"shared": True}, ["granularity is shared but the cache spec says gran=per_subspace"]),
    ("vecinfer:d8b8", {}, ["key codebooks are d4b8 but the cache spec asks for k=d8b8"]),
    ("vecinfer:k=d4b8,v=d4b6", {}, ["value codebooks are d4b8"]),
    ("vecinfer:d4b8", {"layers": 3}, ["n_layers = 3 but the model has 2"]),
    ("vecinfer:d4b8", {"heads": 1}, ["n_kv_heads = 1 but the model has 2"]),
    ("vecinfer:d4b8", {"head_dim": 32}, ["head_dim = 32 but the model has 16"]),
])
def test_calibration_that_does_not_fit(tiny, tmp_path, spec, data_args, needles):
    args = {"layers": 2, "heads": 2, "head_dim": 16, **data_args}
    p = tmp_path / "other.vqcal"
    p.write_bytes(calibration_bytes(args.pop("layers"), args.pop("heads"), args.pop("head_dim"), **args)[0])
    expect_refused(["generate", "-m", tiny[0], *IDS, "--kv-cache", spec, "--calib", p], str(p), *needles)


def test_missing_calibration_file(tiny, tmp_path):
    p = tmp_path / "none.vqcal"
    expect_refused(["generate", "-m", tiny[0], *IDS, "--kv-cache", "vecinfer:d4b8", "--calib", p], str(p),
                   "cannot open")


# ---------------------------------------------------------------- cache specs and options
@pytest.mark.parametrize("spec,needle", [
    ("fp12", "unknown method 'fp12'"),
    ("fp16,r=64", "option 'r=64' does not apply to fp16"),
    ("q8_0,r=64", "option 'r=64' does not apply to q8_0"),
    ("q4_0,sink=4", "does not apply to q4_0"),
    ("kivi2,sink=4", "option 'sink=4' does not apply to kivi2"),
    ("vecinfer:d4b8,g=32", "option 'g=32' does not apply to vecinfer"),
    ("kivi4,gran=shared", "does not apply to kivi4"),
    ("vecinfer:d4b16", "key.bits: 16 must be in 4..12"),
    ("vecinfer:d3b8", "key.sub_dim: 3 must be 2, 4, 8 or 16"),
    ("vecinfer:d32b8", "key.sub_dim: 32"),
    ("vecinfer:d4b8,r=1,r=2", "given twice"),
    ("kivi,b=3", "kivi_bits: 3 must be 2 or 4"),
    ("kivi2,g=0", "kivi_group: 0"),
    ("vecinfer:d4b8,sink=99999", "sink_tokens: 99999"),
    ("vecinfer:x4b8", "d<sub_dim>b<bits>"),
    # Shorthands (issue 26): an empty option list, one preset side alone, an unknown key.
    ("vecinfer:", "nothing after ':'"),
    ("vecinfer:k=d4b8", "k= given without v="),
    ("vecinfer:k=d4b8,zz=1", "unknown option 'zz=1'"),
])
def test_bad_cache_spec_before_the_model(spec, needle):
    expect_refused(["generate", "-m", NO_MODEL, *IDS, "--kv-cache", spec], needle)
    expect_refused(["perplexity", "-m", NO_MODEL, "--text", NO_MODEL, "--kv-cache", spec], needle)


def test_spec_that_does_not_fit_the_model(tmp_path):
    p = tmp_path / "hd24.gguf"
    write_tiny(p, n_embd=96, n_heads=4, n_kv=2, head_dim=24)
    expect_refused(["generate", "-m", p, *IDS, "--kv-cache", "vecinfer:d16b8"], "does not fit", "head_dim 24",
                   "16 does not divide")
    expect_refused(["generate", "-m", p, *IDS, "--kv-cache", "q8_0"], "block of 32")
    expect_refused(["generate", "-m", p, *IDS, "--kv-cache", "kivi2,g=16"], "kivi_group: 16 must divide head_dim 24")


@pytest.mark.parametrize("args,needle", [
    (["generate", "-m", NO_MODEL, *IDS, "--kv-cache", "q8_0", "--calib", "x.vqcal"], "--calib: the kv cache q8_0"),
    (["perplexity", "-m", NO_MODEL, "--text", "t", "--kv-cache", "kivi2", "--calib", "x.vqcal"], "--calib"),
    (["generate", "-m", NO_MODEL, "-p", "hi", "--system", "be brief"], "--system: only applies with --chat"),
    (["generate", "-m", NO_MODEL, "--prompt-ids", "1", "--chat"], "--chat: does not apply to --prompt-ids"),
    (["generate", "-m", NO_MODEL, "-p", "a", "--prompt-ids", "1"], "exactly one of"),
    (["generate", "-m", NO_MODEL, *IDS, "-t", "5000"], "-t: 5000 out of range"),
    (["generate", "-m", NO_MODEL, "--prompt-ids", "1,x"], "'x' is not a token id"),
    (["calibrate", "-m", NO_MODEL, "--text", "t", "-o", "/tmp/x.vqcal", "--iters", "0"], "--iters: 0"),
    (["calibrate", "-m", NO_MODEL, "--text", "t", "-o", "/tmp/x.vqcal", "--kv-cache", "q8_0"], "no codebooks"),
    (["perplexity", "-m", NO_MODEL, "--text", "t", "-c", "1"], "-c: 1 must be >= 2"),
])
def test_options_that_do_not_apply_before_the_model(args, needle):
    expect_refused(args, needle)


@pytest.mark.parametrize("args,needle", [
    (["generate", "--bogus"], "The following argument was not expected: --bogus"),
    (["generate", "-n", "many"], "--n-predict"),
    (["calibrate", "-o", "x.vqcal"], "--text is required"),
    ([], "A subcommand is required"),
    (["nosuchcommand"], "unknown command 'nosuchcommand' (commands: version, generate"),
    (["bench"], "A subcommand is required"),
])
def test_argument_errors_exit_1_in_one_line(args, needle):
    line = expect_refused(args, needle)
    assert "--help" in line or "commands:" in line  # points at the help, or lists the commands


# ---------------------------------------------------------------- output paths
def test_output_paths_checked_before_any_work(tmp_path):
    missing = tmp_path / "no" / "dir" / "out.json"
    for opt in ("--stats-json", "--dump-logits"):
        line = expect_refused(["generate", "-m", NO_MODEL, *IDS, opt, missing], f"{opt} '{missing}'",
                              "does not exist", outputs=[missing])
        assert ".tmp." not in line
    expect_refused(["generate", "-m", NO_MODEL, *IDS, "--stats-json", tmp_path], "is a directory")
    expect_refused(["generate", "-m", NO_MODEL, *IDS, "--stats-json", str(tmp_path) + "/"], "names a directory")
    expect_refused(["generate", "-m", NO_MODEL, *IDS, "--stats-json", "/dev/null"], "not a regular file")
    # calibrate: -o before reading the text or the model (both missing here).
    expect_refused(["calibrate", "-m", NO_MODEL, "--text", NO_MODEL, "-o", missing], f"-o '{missing}'",
                   outputs=[missing])
    expect_refused(["bench", "quantize", "--json", missing], f"--json '{missing}'", outputs=[missing])


def test_failed_run_leaves_no_output(tiny, tmp_path):
    """The outputs are written only at the end: a run that fails midway leaves none."""
    out, dump = tmp_path / "s.json", tmp_path / "d.bin"
    expect_refused(["generate", "-m", tiny[0], "--prompt-ids", "1,2,500", "-n", "2", "--stats-json", out,
                    "--dump-logits", dump], "500", outputs=[out, dump])


# ---------------------------------------------------------------- input files
def test_input_files_have_a_size_limit(tmp_path):
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:  # sparse: no disk space used
        f.truncate(17 << 20)
    expect_refused(["generate", "-m", NO_MODEL, "-f", big], f"--prompt-file '{big}'", "exceeds the limit of 16 MiB")
    expect_refused(["generate", "-m", NO_MODEL, "--prompt-ids", f"@{big}"], "exceeds the limit of 16 MiB")
    expect_refused(["generate", "-m", NO_MODEL, "-f", "/dev/zero"], "more than the limit of 16 MiB")
    huge = tmp_path / "huge.txt"
    with open(huge, "wb") as f:
        f.truncate(300 << 20)
    expect_refused(["perplexity", "-m", NO_MODEL, "--text", huge], "exceeds the limit of 256 MiB")
    expect_refused(["calibrate", "-m", NO_MODEL, "--text", huge, "-o", tmp_path / "c.vqcal"],
                   "exceeds the limit of 256 MiB", outputs=[tmp_path / "c.vqcal"])
    expect_refused(["generate", "-m", NO_MODEL, "-f", tmp_path / "none.txt"], "cannot open")
    expect_refused(["generate", "-m", NO_MODEL, "-f", tmp_path], "is a directory")


# ---------------------------------------------------------------- terminal control characters
def test_control_characters_are_escaped(tiny, tmp_path):
    evil = "x\x1b]0;pwned\x07\x1b[2J"
    line = expect_refused(["generate", "-m", NO_MODEL, "-f", tmp_path / evil], "\\x1b]0;pwned\\x07\\x1b[2J")
    assert "pwned" in line
    # From file contents: an id list with an escape sequence in it.
    ids = tmp_path / "ids.txt"
    ids.write_bytes(b"1 2 \x1b[31mred\n")
    expect_refused(["generate", "-m", NO_MODEL, "--prompt-ids", f"@{ids}"], "'\\x1b[31mred' is not a token id")
    # From a model: a tensor named with an escape sequence and a broken type.
    import gguf
    p = tmp_path / "evil.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_name("evil\x1b[5mblink")
    import numpy as np
    w.add_tensor("blk.0\x1b[31m.weight", np.zeros(32, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    poke(p, tensor_fields(p, "blk.0\x1b[31m.weight")[0], "<I", 200)
    expect_refused(["info", p], "blk.0\\x1b[31m.weight", "unknown tensor type id 200")
