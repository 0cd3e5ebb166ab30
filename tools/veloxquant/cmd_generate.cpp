#include "commands.h"
#include "core/error.h"

namespace vq::cli {
void add_generate(CLI::App& app) {
  app.add_subcommand("generate", "(generate: not built yet)")->callback([] { VQ_FAIL("generate: not implemented yet"); });
}
}  // namespace vq::cli
