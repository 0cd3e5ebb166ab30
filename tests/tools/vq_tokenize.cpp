// Test tool: tokenizes a file with vq::Tokenizer built from a GGUF and prints the ids, or decodes
// ids back to bytes. Used by tests/python/test_tokenizer_reference.py.
//   vq_tokenize [--pre NAME] [--no-special] [--bos] [--repeat N] MODEL.gguf TEXT_FILE   -> ids on one line
//   vq_tokenize --decode [--special] MODEL.gguf IDS_FILE                               -> raw bytes
//   vq_tokenize --pieces [--pre NAME] MODEL.gguf TEXT_FILE    -> pre-tokenizer pieces, one hex line each
// --repeat N encodes N times and prints the mean encode time on stderr.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>

#include "core/error.h"
#include "model/gguf.h"
#include "model/text_gguf.h"
#include "text/tokenizer.h"
#include "text/tokenizer_pretok.h"

namespace {

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw vq::Error("cannot open " + path);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string pre, model, input;
    bool special = true, bos = false, decode = false, render_special = false, pieces = false;
    int repeat = 0;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--pre" && i + 1 < argc) pre = argv[++i];
      else if (a == "--no-special") special = false;
      else if (a == "--bos") bos = true;
      else if (a == "--decode") decode = true;
      else if (a == "--special") render_special = true;
      else if (a == "--pieces") pieces = true;
      else if (a == "--repeat" && i + 1 < argc) repeat = std::stoi(argv[++i]);
      else if (model.empty()) model = a;
      else if (input.empty()) input = a;
      else throw vq::Error("unexpected argument " + a);
    }
    if (model.empty() || input.empty()) throw vq::Error("usage: vq_tokenize [options] MODEL.gguf FILE");
    vq::GGUFFile g(model);
    vq::TokenizerData d = vq::tokenizer_data_from_gguf(g);
    if (!pre.empty()) d.pre = pre;
    const vq::Tokenizer tok(d);
    const std::string text = read_all(input);
    if (decode) {
      std::istringstream in(text);
      std::vector<int32_t> ids;
      for (long v; in >> v;) ids.push_back(static_cast<int32_t>(v));
      const std::string out = tok.decode(ids, render_special);
      std::fwrite(out.data(), 1, out.size(), stdout);
      return 0;
    }
    if (pieces) {
      std::vector<vq::detail::Span> spans;
      vq::detail::pre_tokenize(vq::detail::pretok_from_name(d.pre), text, spans);
      for (const auto& sp : spans) {
        for (uint32_t k = 0; k < sp.len; ++k) std::printf("%02x", static_cast<uint8_t>(text[sp.off + k]));
        std::putchar('\n');
      }
      return 0;
    }
    std::vector<int32_t> ids = tok.encode(text, bos, special);
    if (repeat > 0) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < repeat; ++r) ids = tok.encode(text, bos, special);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / repeat;
      std::fprintf(stderr, "encode: %zu bytes -> %zu tokens in %.3f ms (%.1f MB/s)\n", text.size(), ids.size(),
                   s * 1e3, text.size() / s / 1e6);
    }
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) line.push_back(' ');
      line += std::to_string(ids[i]);
    }
    std::puts(line.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "vq_tokenize: %s\n", e.what());
    return 1;
  }
}
