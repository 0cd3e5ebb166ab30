#include "commands.h"
#include "core/error.h"

namespace vq::cli {
void add_perplexity(CLI::App& app) {
  app.add_subcommand("perplexity", "(perplexity: not built yet)")->callback([] { VQ_FAIL("perplexity: not implemented yet"); });
}
}  // namespace vq::cli
