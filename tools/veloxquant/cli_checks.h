#pragma once
// Checks the subcommands run before any expensive work, so that a bad option or input fails in
// one line at once rather than after minutes (docs/RELIABILITY.md lists the cases).
#include <cstddef>
#include <cstdint>
#include <string>

#include "veloxquant/config.h"
#include "veloxquant/kv_spec.h"

namespace vq::cli {

// Options that only a VecInfer cache uses (--calib) given with another method.
void check_cache_flags(const KVCacheConfig& cfg, const std::string& calib_flag);

// What depends on the model's geometry (head_dim divisibility, the Hadamard block), right after
// the model is mapped and before any calibration or generation. (The KV spec itself, with its
// calibration checked against the model, comes from one place: veloxquant::KVSpec::for_model /
// for_model_config. Every weight finite: Model::check_weights_finite.)
void check_cache_fits_model(const KVCacheConfig& cfg, int head_dim, const std::string& model_path);

// Logits [n_vocab] after position pos must be finite: NaN or inf weights (which the loader does
// not scan, that would read every weight) or an overflowing cache otherwise sample garbage
// with exit 0. Throws naming the position and the first bad entry.
void check_logits_finite(const float* logits, int n_vocab, int64_t pos);

// Contexts: the most tokens any command runs in one sequence, whatever the model (16M).
constexpr int64_t kMaxContextTokens = int64_t(1) << 24;

// n tokens of context (what: "-c", "the prompt", ...) against the model's trained context: past
// it, an error unless allow_longer (--allow-longer-context), then one warning on stderr; past
// kMaxContextTokens always an error. A model that records no trained context is not checked.
// n_ctx_train: the model's (ModelConfig / ModelInfo::n_ctx_train).
void check_trained_context(int64_t n, int64_t n_ctx_train, bool allow_longer, const std::string& what);

// The KV budget (from --kv-budget MIB, 0: the default share) must hold at least one block of
// every form in every layer of the cache (min_budget_bytes of the Session or Engine, cache
// kv_name), or nothing can run: refused naming the flag.
void check_kv_budget_holds_a_block(size_t budget, double mib, size_t min_budget_bytes, const std::string& kv_name);

// serve --session-dir: given explicitly, an existing writable directory; the default, when it
// exists, too (it is made at the first save otherwise). Checked before the model loads.
void check_session_dir(const std::string& dir, bool given);

// --load-session: a regular file (not a link, directory, device or pipe) that can be opened,
// checked before the model loads; its contents are checked by load_sequence.
void check_session_input(const std::string& path, const std::string& what);

// The spec's quality warning (KVSpec::quality_warning: its calibration's held-out check measured
// a KL vs fp16 above the target), as one "veloxquant: warning:" line on stderr; nothing otherwise.
void warn_kv_quality(const veloxquant::KVSpec& spec);

// Text from a file (a prompt, an id list, a name) made safe to print on a terminal.
std::string printable(const std::string& text);

}  // namespace vq::cli
