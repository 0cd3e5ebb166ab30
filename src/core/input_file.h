#pragma once
// Whole-file reads of user inputs (prompts, token id lists, texts) with a stated size limit, so
// that a wrong path (a disk image, /dev/zero) fails at once instead of filling the memory.
#include <cstdint>
#include <string>

namespace vq {

// Prompt files and token id lists: far beyond any context window (16 MiB ~ 4M tokens of text).
constexpr uint64_t kMaxPromptFileBytes = uint64_t(16) << 20;
// Calibration and evaluation texts (after decompression).
constexpr uint64_t kMaxTextFileBytes = uint64_t(256) << 20;

// Reads all of `path` (a regular file, or a pipe such as /dev/stdin) when it holds at most
// max_bytes. Throws vq::Error "<what> '<path>': <problem>" when it is missing, a directory,
// unreadable or larger than the limit.
std::string read_input_file(const std::string& path, uint64_t max_bytes, const std::string& what);

// "16 MiB": a size limit for messages.
std::string format_size_limit(uint64_t bytes);

}  // namespace vq
