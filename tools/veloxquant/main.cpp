// veloxquant: the one command-line tool. Every error, the argument errors included, becomes one
// line on stderr ("veloxquant: error: ...", control characters escaped) and exit code 1.
#include <cstdio>
#include <exception>
#include <new>
#include <string>

#include "commands.h"
#include "core/text_escape.h"
#include "veloxquant/status.h"

namespace {
int fail(const std::string& what) {
  std::fflush(stdout);
  // Messages quote file names, metadata and file contents: escaped, a message stays one line
  // and cannot drive the terminal.
  std::fprintf(stderr, "veloxquant: error: %s\n", vq::escape_control(what).c_str());
  return 1;
}
}  // namespace

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
  vq::cli::add_serve(app);
  // CLI11 reports an unknown command as "a subcommand is required": name it and list the known.
  if (argc > 1 && argv[1][0] != '-') {
    std::string known;
    bool found = false;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
      known += (known.empty() ? "" : ", ") + sub->get_name();
      found = found || sub->get_name() == argv[1];
    }
    if (!found) return fail("unknown command '" + std::string(argv[1]) + "' (commands: " + known + ")");
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version arrive as "errors" with exit code 0: print them as CLI11 does.
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    std::string cmd = "veloxquant";  // the subcommand(s) given, for the help hint
    for (const CLI::App* a = &app; !a->get_subcommands().empty();) {
      a = a->get_subcommands().front();
      cmd += " " + a->get_name();
    }
    return fail(std::string(e.what()) + " (see " + cmd + " --help)");
  } catch (const vq::Error& e) {
    return fail(e.what());
  } catch (const std::bad_alloc&) {
    return fail("out of memory");
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  return 0;
}
