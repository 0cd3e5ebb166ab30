"""Compares vq::Tokenizer (through the tests/tools/vq_tokenize binary) with an independent
implementation: the HF `tokenizers` package, built here from the GGUF's own vocabulary and merges
(byte-level BPE model, the model's split pattern, byte-level decoder, control tokens as special
added tokens). Texts are real: a slice of the Jargon File and a Python tutorial page (both
installed by scripts/setup.sh as Debian docs), plus code, numbers, punctuation, non-ASCII text and
odd whitespace. Besides SmolLM2's own pre-tokenizer ("smollm") the same vocabulary is run through
the GPT-2, Llama 3 and Qwen2 split patterns, which checks those scanners against the regexes.
"""
import gzip
import os
import pathlib
import subprocess

import pytest

gguf = pytest.importorskip("gguf")
tokenizers = pytest.importorskip("tokenizers")
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers  # noqa: E402

MODEL = pathlib.Path(os.environ.get("VQ_TOKENIZER_MODEL",
                                    pathlib.Path.home() / ".cache/veloxquant/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
JARGON = pathlib.Path("/usr/share/doc/jargon-text/jargon.txt.gz")
PY_TUTORIAL = pathlib.Path("/usr/share/doc/python3-doc/html/_sources/tutorial")

# Split patterns of the pre-tokenizers (the regexes the C++ scanners implement by hand).
GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3 = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"""
          r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")

EXTRA = [
    "café naïve 日本語 🙂 Ünïcödé — “quotes” ‘single’ … Ελληνικά русский العربية हिन्दी 한국어 ﬁ",
    "def f(x):\n    return x**2  # square\n\n\tif a != b: print(f\"{a!r:>10}\")\n",
    "Numbers: 1234567890, 3.14159, -42, 1e-9, 0x1F, 12,345,678.90 and ١٢٣ ² ½ Ⅻ",
    "I'm sure you'll say we've done it, they'd DON'T WE'RE You'LL it's Bob's 'quoted' ''x'' 's",
    "multiple   spaces    here\n\n\n  and\ttabs\t\t\tand  \n \n trailing   \r\nwindows\r\n\r\nend   ",
    "punctuation!!! ??? ... --- ((()))[]{} <>@#$%^&*_+=|\\/~` ;:,. «»",
    "<|im_start|>user\nHello there!<|im_end|>\n<|im_start|>assistant\nHi<|im_end|><|endoftext|>",
    "A\u00a0non-breaking space, zero\u200bwidth, e\u0301 combining, \u3000ideographic space",
    "   leading spaces and a final newline\n",
]


def load_vocab(path):
    r = gguf.GGUFReader(str(path))

    def arr(key):
        f = r.fields[key]
        return [f.parts[i] for i in f.data]

    def scalar(key):
        f = r.fields[key]
        return f.parts[f.data[0]]

    tokens = [bytes(p).decode("utf-8") for p in arr("tokenizer.ggml.tokens")]
    types = [int(p[0]) for p in arr("tokenizer.ggml.token_type")]
    merges = [bytes(p).decode("utf-8") for p in arr("tokenizer.ggml.merges")]
    pre = bytes(scalar("tokenizer.ggml.pre")).decode()
    model = bytes(scalar("tokenizer.ggml.model")).decode()
    return model, pre, tokens, types, merges


def hf_tokenizer(tokens, types, merges, pre):
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    bpe = models.BPE(vocab=vocab, merges=pairs, ignore_merges=(pre == "llama-bpe"))
    tok = Tokenizer(bpe)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    else:
        pattern = {"gpt2": GPT2, "llama-bpe": LLAMA3, "qwen2": QWEN2}[pre]
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False), byte_level])
    tok.decoder = decoders.ByteLevel()
    special = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3]
    tok.add_special_tokens(special)
    return tok


def corpus():
    parts = []
    if JARGON.exists():
        text = gzip.open(JARGON, "rt", encoding="utf-8").read()
        parts.append(text[400_000:412_000])  # glossary entries: prose, quotes, dates, box drawing
    if PY_TUTORIAL.exists():
        parts.append((PY_TUTORIAL / "controlflow.rst.txt").read_text(encoding="utf-8")[:8000])
    assert parts, "no real text found (jargon-text / python3-doc are installed by scripts/setup.sh)"
    return parts + EXTRA


@pytest.fixture(scope="module")
def tool():
    build = os.environ.get("VQ_BUILD_DIR")
    if not build:
        pytest.skip("VQ_BUILD_DIR is not set (run through ctest, which sets it)")
    exe = pathlib.Path(build) / "tests/tools/vq_tokenize"
    assert exe.exists(), f"{exe} is missing: build the vq_tokenize target"
    return exe


@pytest.fixture(scope="module")
def vocab():
    if not MODEL.exists():
        pytest.skip(f"model {MODEL} is absent (scripts/setup.sh fetches it)")
    return load_vocab(MODEL)


def vq_encode(tool, text, tmp_path, pre=None, special=True):
    f = tmp_path / "in.txt"
    f.write_bytes(text.encode("utf-8"))
    cmd = [str(tool)] + (["--pre", pre] if pre else []) + ([] if special else ["--no-special"])
    out = subprocess.run(cmd + [str(MODEL), str(f)], capture_output=True, check=True)
    return [int(x) for x in out.stdout.split()]


def vq_decode(tool, ids, tmp_path):
    f = tmp_path / "ids.txt"
    f.write_text(" ".join(map(str, ids)))
    out = subprocess.run([str(tool), "--decode", "--special", str(MODEL), str(f)], capture_output=True, check=True)
    return out.stdout.decode("utf-8")


def first_difference(a, b, tok):
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    show = lambda ids: [tok.id_to_token(t) for t in ids[max(0, i - 3):i + 5]]  # noqa: E731
    return f"first difference at {i} of {len(a)}/{len(b)}: vq {show(a)} vs hf {show(b)}"


@pytest.mark.parametrize("pre", ["smollm", "gpt2", "llama-bpe", "qwen2"])
def test_ids_match_hf_tokenizers(tool, vocab, tmp_path, pre):
    model, native_pre, tokens, types, merges = vocab
    assert model == "gpt2" and native_pre == "smollm"
    hf = hf_tokenizer(tokens, types, merges, pre)
    total = 0
    for text in corpus():
        ours = vq_encode(tool, text, tmp_path, pre=None if pre == native_pre else pre)
        ref = hf.encode(text, add_special_tokens=False).ids
        assert ours == ref, first_difference(ours, ref, hf)
        total += len(ours)
    assert total > 3000  # the corpus really is several KB of text


def test_round_trip_and_specials(tool, vocab, tmp_path):
    _, _, tokens, types, merges = vocab
    hf = hf_tokenizer(tokens, types, merges, "smollm")
    for text in corpus():
        ids = vq_encode(tool, text, tmp_path)
        assert vq_decode(tool, ids, tmp_path) == text
        assert hf.decode(ids, skip_special_tokens=False) == text
    # Special tokens: one id each with parse_special, plain text pieces without it.
    chat = "<|im_start|>user\nHi<|im_end|>"
    ids = vq_encode(tool, chat, tmp_path)
    assert ids[0] == tokens.index("<|im_start|>") and ids[-1] == tokens.index("<|im_end|>")
    plain = vq_encode(tool, chat, tmp_path, special=False)
    assert tokens.index("<|im_start|>") not in plain and len(plain) > len(ids)
    assert plain == hf_tokenizer(tokens, [1] * len(types), merges, "smollm").encode(chat).ids


def byte_decoder():
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, n = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + n)] = b
            n += 1
    return table


@pytest.mark.parametrize("pre", ["smollm", "gpt2", "llama-bpe", "qwen2"])
def test_pre_tokenizer_pieces_match_regex(tool, vocab, tmp_path, pre):
    """The split itself, piece by piece (ids alone can hide a wrong split when no merge crosses it)."""
    _, _, tokens, types, merges = vocab
    hf = hf_tokenizer(tokens, types, merges, pre)
    dec = byte_decoder()
    for text in corpus():
        f = tmp_path / "in.txt"
        f.write_bytes(text.encode("utf-8"))
        out = subprocess.run([str(tool), "--pieces", "--pre", pre, str(MODEL), str(f)], capture_output=True, check=True)
        ours = out.stdout.decode().split()
        ref = [bytes(dec[c] for c in piece).hex() for piece, _ in hf.pre_tokenizer.pre_tokenize_str(text)]
        if ours != ref:
            i = next((k for k, (x, y) in enumerate(zip(ours, ref)) if x != y), min(len(ours), len(ref)))
            show = lambda ps: [bytes.fromhex(p).decode("utf-8", "replace") for p in ps[max(0, i - 2):i + 3]]  # noqa: E731
            pytest.fail(f"{pre}: piece {i} differs: vq {show(ours)} vs regex {show(ref)}")


# --- SentencePiece ("llama" tokenizer model) against the sentencepiece package -----------------

def train_spm(tmp_path):
    """A small BPE SentencePiece model with byte fallback trained on the real text, written as a
    tokenizer-only GGUF the C++ side loads."""
    spm = pytest.importorskip("sentencepiece", reason="sentencepiece (scripts/requirements-test.txt) is not installed")
    import io
    lines = [ln for part in corpus()[:2] for ln in part.splitlines() if ln.strip()]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=1000, model_type="bpe",
        byte_fallback=True, character_coverage=0.995, normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=True, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    pieces, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        pieces.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        types.append(6 if sp.is_byte(i) else 3 if sp.is_control(i) else 2 if sp.is_unknown(i)
                     else 5 if sp.is_unused(i) else 1)
    path = tmp_path / "spm.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(pieces)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return sp, path


def test_sentencepiece_ids_match(tool, tmp_path):
    sp, model = train_spm(tmp_path)
    assert sum(1 for i in range(sp.get_piece_size()) if sp.is_byte(i)) == 256
    total = fallback = 0
    for k, text in enumerate(corpus()):
        f = tmp_path / f"in{k}.txt"
        f.write_bytes(text.encode("utf-8"))
        out = subprocess.run([str(tool), str(model), str(f)], capture_output=True, check=True)
        ours = [int(x) for x in out.stdout.split()]
        ref = sp.encode(text)
        if ours != ref:
            i = next((j for j, (x, y) in enumerate(zip(ours, ref)) if x != y), min(len(ours), len(ref)))
            pytest.fail(f"text {k}: first difference at {i}: vq {[sp.id_to_piece(t) for t in ours[i:i + 5]]} "
                        f"vs sentencepiece {[sp.id_to_piece(t) for t in ref[i:i + 5]]}")
        total += len(ours)
        fallback += sum(1 for t in ours if sp.is_byte(t))
        ids = tmp_path / "ids.txt"
        ids.write_text(" ".join(map(str, ours)))
        dec = subprocess.run([str(tool), "--decode", str(model), str(ids)], capture_output=True, check=True)
        assert dec.stdout.decode("utf-8") == sp.decode(ref) == text
    print(f"sentencepiece: {total} tokens, {fallback} byte-fallback tokens")
    assert total > 3000 and fallback > 10  # real text, and byte fallback exercised (CJK, emoji)
