#include "commands.h"
#include "core/error.h"

namespace vq::cli {
void add_info(CLI::App& app) {
  app.add_subcommand("info", "(info: not built yet)")->callback([] { VQ_FAIL("info: not implemented yet"); });
}
}  // namespace vq::cli
