#include "eval/passkey.h"

#include <algorithm>
#include <cctype>
#include <random>

#include "core/error.h"
#include "model/session.h"

namespace vq {

namespace {
// The wording follows the passkey test of the long-context literature (Mohtashami & Jaggi 2023):
// an instruction up front, the key sentence repeated once inside it, a question that the answer
// completes.
constexpr const char* kIntro =
    "There is an important pass key hidden inside a lot of irrelevant text. Find it and memorize it. "
    "I will quiz you about the pass key.\n\n";
constexpr const char* kQuestion = "\n\nWhat is the pass key? The pass key is";

int argmax(const float* x, int n) {
  int a = 0;
  for (int i = 1; i < n; ++i)
    if (x[i] > x[a]) a = i;
  return a;
}
}  // namespace

PasskeyPrompt make_passkey_prompt(const Tokenizer& tok, const std::vector<int32_t>& filler, int64_t offset,
                                  int n_tokens, double depth, uint64_t seed) {
  VQ_CHECK(depth >= 0.0 && depth <= 1.0, "passkey: depth {} must be in [0, 1]", depth);
  std::mt19937_64 rng(seed);
  PasskeyPrompt p;
  p.key = std::to_string(10000 + int(rng() % 90000));
  const std::string needle = "\n\nThe pass key is " + p.key + ". Remember it. " + p.key + " is the pass key.\n\n";
  const std::vector<int32_t> intro = tok.encode(kIntro, tok.add_bos_default());
  const std::vector<int32_t> nd = tok.encode(needle, false), q = tok.encode(kQuestion, false);
  const int64_t n_fill = int64_t(n_tokens) - int64_t(intro.size() + nd.size() + q.size());
  VQ_CHECK(n_fill >= 1, "passkey: {} tokens leave no room for the distractor text", n_tokens);
  VQ_CHECK(offset >= 0 && offset + n_fill <= int64_t(filler.size()),
           "passkey: the distractor text has {} tokens, {} needed from offset {}", filler.size(), n_fill, offset);
  const int64_t at = std::llround(depth * double(n_fill));
  const auto f0 = filler.begin() + offset;
  p.ids = intro;
  p.ids.insert(p.ids.end(), f0, f0 + at);
  p.needle_pos = int64_t(p.ids.size());
  p.ids.insert(p.ids.end(), nd.begin(), nd.end());
  p.ids.insert(p.ids.end(), f0 + at, f0 + n_fill);
  p.ids.insert(p.ids.end(), q.begin(), q.end());
  return p;
}

std::string first_digits(const std::string& text) {
  auto b = std::find_if(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c); });
  auto e = std::find_if(b, text.end(), [](unsigned char c) { return !std::isdigit(c); });
  return std::string(b, e);
}

PasskeyAnswer answer_passkey(const Model& model, const KVSpec& spec, const PasskeyPrompt& p, int max_new,
                             int chunk, KVDevice device) {
  VQ_CHECK(max_new >= 1, "passkey: max_new {} must be >= 1", max_new);
  const int V = model.config().n_vocab;
  Session s(model, spec, int(p.ids.size()) + max_new, chunk, size_t(-1), device);
  std::vector<float> logits(static_cast<size_t>(V));
  s.forward(p.ids.data(), int(p.ids.size()), logits.data());
  std::vector<int32_t> out;
  PasskeyAnswer a;
  for (int i = 0; i < max_new; ++i) {
    int32_t t = argmax(logits.data(), V);
    if (model.tokenizer().is_eog(t)) break;
    out.push_back(t);
    a.text = model.tokenizer().decode(out);
    // Stop once a run of digits has ended: the answer is complete.
    const std::string d = first_digits(a.text);
    if (!d.empty() && a.text.find(d) + d.size() < a.text.size()) break;
    if (i + 1 < max_new) s.forward(&t, 1, logits.data());
  }
  a.digits = first_digits(a.text);
  a.correct = a.digits == p.key;
  return a;
}

}  // namespace vq
