#include "commands.h"
#include "core/error.h"

namespace vq::cli {
void add_bench(CLI::App& app) {
  app.add_subcommand("bench", "(bench: not built yet)")->callback([] { VQ_FAIL("bench: not implemented yet"); });
}
}  // namespace vq::cli
