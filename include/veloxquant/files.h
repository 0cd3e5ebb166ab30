#pragma once
// Files the way the library reads and writes them: text corpora (plain, .gz, .html), outputs
// written to a temporary name and renamed (a failed run never leaves a half-written file), and
// output paths checked before any long work.
#include <string>

namespace veloxquant {

// A text corpus: ".gz" files through `gzip -dc`, HTML tags stripped from ".html" files, at most
// 256 MiB; throws vq::Error naming the path when it cannot be read.
std::string read_text_file(const std::string& path);
// Throws now, "<what> '<path>': <problem>", when a later write_file_atomic(path) could not write:
// an empty path, a directory, a missing or read-only folder.
void check_output_path(const std::string& path, const std::string& what);
// Writes content to path.tmp-<random> and renames it over path; throws naming the path.
void write_file_atomic(const std::string& path, const std::string& content);

}  // namespace veloxquant
