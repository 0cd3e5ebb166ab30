#pragma once
// The per-user cache folder of VeloxQuant, shared by the library (first-use calibration files in
// <cache>/calib) and the CLI (models it fetches into <cache>/models). Only the path convention
// lives here; fetching is the CLI's business (tools/model_fetch).
#include <string>

namespace vq {

// $VQ_CACHE_DIR, else $XDG_CACHE_HOME/veloxquant, else $HOME/.cache/veloxquant (not created).
// Throws vq::Error when none of the three variables is set.
std::string cache_dir();

}  // namespace vq
