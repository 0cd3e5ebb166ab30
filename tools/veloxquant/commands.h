#pragma once
// Each subcommand lives in its own cmd_<name>.cpp and registers itself on the app.
#include <CLI/CLI.hpp>

namespace vq::cli {
void add_generate(CLI::App& app);
void add_info(CLI::App& app);
void add_calibrate(CLI::App& app);
void add_perplexity(CLI::App& app);
void add_eval(CLI::App& app);  // cmd_eval.cpp
void add_bench(CLI::App& app);
void add_serve(CLI::App& app);  // cmd_serve.cpp
void add_bench_e2e(CLI::App* bench);  // bench_e2e.cpp
}  // namespace vq::cli
