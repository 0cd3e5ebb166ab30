// veloxquant: the one command-line tool. Errors become one line on stderr and exit code 1.
#include <cstdio>
#include <exception>
#include <new>

#include "commands.h"
#include "veloxquant/status.h"

int main(int argc, char** argv) {
  CLI::App app{"VeloxQuant: compressed KV caches for LLM inference"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("veloxquant ") + VQ_VERSION);
  app.add_subcommand("version", "Print the version")->callback([] {
    std::printf("veloxquant %s\n", VQ_VERSION);
  });
  vq::cli::add_generate(app);
  vq::cli::add_info(app);
  vq::cli::add_calibrate(app);
  vq::cli::add_perplexity(app);
  vq::cli::add_eval(app);
  vq::cli::add_bench(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const vq::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "veloxquant: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    std::fprintf(stderr, "veloxquant: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "veloxquant: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
