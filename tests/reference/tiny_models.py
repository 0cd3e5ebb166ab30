"""Tiny random llama-family GGUF models for the Python tests (written with the `gguf` package)."""
import numpy as np
import gguf


def write_tiny(path, arch="llama", n_layers=2, n_embd=64, n_heads=4, n_kv=2, head_dim=16, n_ff=96,
               n_vocab=101, key_length=False, tied=False, bias=False, qk_norm=False, scaling=None,
               rope_freqs=False, seed=0, replace=None, sliding_window=None, swa_pattern=None,
               rope_base_swa=None, vocab=False):
    """A tiny random model with float32 weights, written with the `gguf` package's writer.
    replace: {tensor name: (uint8 array [rows, row bytes], GGMLQuantizationType)} swaps a
    tensor for raw data of another type (bad-input tests).
    gemma3: qk_norm and the post-norms are always written; sliding_window (default 8) and the
    optional swa_pattern (an int period or a list of bools per layer) and rope_base_swa keys.
    vocab: also write a SentencePiece-style vocabulary (<pad> <eos> <bos> <unk>, the 256 byte
    tokens, then plain pieces up to n_vocab >= 261) so that llama.cpp loads the file."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.block_count", n_layers)
    w.add_uint32(f"{arch}.embedding_length", n_embd)
    w.add_uint32(f"{arch}.feed_forward_length", n_ff)
    w.add_uint32(f"{arch}.attention.head_count", n_heads)
    w.add_uint32(f"{arch}.attention.head_count_kv", n_kv)
    w.add_uint32(f"{arch}.context_length", 512)
    # gemma3: the real model's global base, so that its local layers' default (10000) differs
    w.add_float32(f"{arch}.rope.freq_base", 1e6 if arch == "gemma3" else 10000.0)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    gemma = arch == "gemma3"
    if gemma:
        qk_norm = True
        w.add_uint32(f"{arch}.attention.sliding_window", 8 if sliding_window is None else sliding_window)
        if isinstance(swa_pattern, list):
            w.add_array(f"{arch}.attention.sliding_window_pattern", [bool(x) for x in swa_pattern])
        elif swa_pattern is not None:
            w.add_uint32(f"{arch}.attention.sliding_window_pattern", swa_pattern)
        if rope_base_swa is not None:
            w.add_float32(f"{arch}.rope.freq_base_swa", rope_base_swa)
    if vocab:
        assert n_vocab >= 261, "the vocabulary needs 4 specials and 256 byte tokens"
        toks = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)]
        toks += [f"\u2581w{i}" for i in range(n_vocab - len(toks))]
        types = [3, 3, 3, 2] + [6] * 256 + [1] * (n_vocab - 260)
        w.add_tokenizer_model("llama")
        w.add_token_list(toks)
        w.add_token_scores([0.0] * 260 + [-float(i) for i in range(n_vocab - 260)])
        w.add_token_types(types)
        w.add_bos_token_id(2)
        w.add_eos_token_id(1)
    if key_length:
        w.add_uint32(f"{arch}.attention.key_length", head_dim)
        w.add_uint32(f"{arch}.attention.value_length", head_dim)  # llama.cpp needs both
    if scaling:
        w.add_string(f"{arch}.rope.scaling.type", scaling)
        w.add_float32(f"{arch}.rope.scaling.factor", 8.0 if scaling == "llama3" else 4.0)
        if scaling == "llama3":
            w.add_float32(f"{arch}.rope.scaling.low_freq_factor", 1.0)
            w.add_float32(f"{arch}.rope.scaling.high_freq_factor", 4.0)
            w.add_uint32(f"{arch}.rope.scaling.original_context_length", 32)

    replace = replace or {}

    def mat(name, rows, cols):
        if name in replace:
            raw, qtype = replace[name]
            w.add_tensor(name, raw, raw_dtype=qtype)
            return
        w.add_tensor(name, (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32))

    def vec(name, n, base, scale):
        w.add_tensor(name, (base + scale * rng.standard_normal(n)).astype(np.float32))

    qd, kvd = n_heads * head_dim, n_kv * head_dim
    w.add_tensor("token_embd.weight", rng.standard_normal((n_vocab, n_embd)).astype(np.float32))
    if not tied:
        mat("output.weight", n_vocab, n_embd)
    vec("output_norm.weight", n_embd, 1.0, 0.1)
    if rope_freqs:
        w.add_tensor("rope_freqs.weight", (1.0 + np.arange(head_dim // 2) % 3).astype(np.float32))
    for l in range(n_layers):
        p = f"blk.{l}."
        vec(p + "attn_norm.weight", n_embd, 1.0, 0.1)
        vec(p + "ffn_norm.weight", n_embd, 1.0, 0.1)
        mat(p + "attn_q.weight", qd, n_embd)
        mat(p + "attn_k.weight", kvd, n_embd)
        mat(p + "attn_v.weight", kvd, n_embd)
        mat(p + "attn_output.weight", n_embd, qd)
        mat(p + "ffn_gate.weight", n_ff, n_embd)
        mat(p + "ffn_up.weight", n_ff, n_embd)
        mat(p + "ffn_down.weight", n_embd, n_ff)
        if bias:
            vec(p + "attn_q.bias", qd, 0.0, 0.5)
            vec(p + "attn_k.bias", kvd, 0.0, 0.5)
            vec(p + "attn_v.bias", kvd, 0.0, 0.5)
        if qk_norm:
            vec(p + "attn_q_norm.weight", head_dim, 1.0, 0.2)
            vec(p + "attn_k_norm.weight", head_dim, 1.0, 0.2)
        if gemma:
            vec(p + "post_attention_norm.weight", n_embd, 1.0, 0.1)
            vec(p + "post_ffw_norm.weight", n_embd, 1.0, 0.1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
