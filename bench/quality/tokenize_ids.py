"""Token ids of a text with a GGUF's own BPE vocabulary through the `tokenizers` package (the same
construction tests/python/test_tokenizer_reference.py checks against VeloxQuant's tokenizer), for
bench/quality/kv_record.py:  python bench/quality/tokenize_ids.py MODEL.gguf TEXT[.gz] OUT.ids"""
import gzip
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests" / "python"))
from test_tokenizer_reference import hf_tokenizer, load_vocab  # noqa: E402

_, pre, tokens, types, merges = load_vocab(sys.argv[1])
tok = hf_tokenizer(tokens, types, merges, pre)
p = sys.argv[2]
text = gzip.open(p, "rt").read() if p.endswith(".gz") else open(p).read()
ids = tok.encode(text).ids
open(sys.argv[3], "w").write(" ".join(map(str, ids)))
print(len(ids))
