#pragma once
// Pre-tokenizers of byte-level BPE models: the split patterns of the model families, implemented
// as hand-written scanners over code points (no regex engine). The patterns, in regex notation:
//   Gpt2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   Llama3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}
//           | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   Qwen2:  as Llama3 with \p{N} (one digit per piece) instead of \p{N}{1,3}
//   SmolLM: every \p{N} character is a piece of its own (HF "Digits" with individual_digits),
//           then the Gpt2 pattern on the text between them.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace vq::detail {

enum class PreTokKind { Gpt2, Llama3, Qwen2, SmolLM };

// Maps tokenizer.ggml.pre to a scanner. Unknown names get Gpt2 (*known = false).
PreTokKind pretok_from_name(const std::string& name, bool* known = nullptr);
const char* pretok_name(PreTokKind k);

struct Span { uint32_t off, len; };  // bytes of the input

// Appends the pieces of text, in order, covering every byte exactly once.
void pre_tokenize(PreTokKind kind, std::string_view text, std::vector<Span>& out);

}  // namespace vq::detail
