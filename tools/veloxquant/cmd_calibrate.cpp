#include "commands.h"
#include "core/error.h"

namespace vq::cli {
void add_calibrate(CLI::App& app) {
  app.add_subcommand("calibrate", "(calibrate: not built yet)")->callback([] { VQ_FAIL("calibrate: not implemented yet"); });
}
}  // namespace vq::cli
