#pragma once
// --device cpu|cuda|auto for the commands that run the model: which device runs the forward and
// holds the KV pool (veloxquant::Device, public API). auto takes cuda when a usable GPU is present
// (and this build has the CUDA backend), else cpu, and says which on stderr.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "veloxquant/runtime.h"
#include "veloxquant/status.h"

namespace vq::cli {

inline void add_device_option(CLI::App* c, std::string& device) {
  c->add_option("--device", device, "Where the model runs and the KV pool lives: cpu, cuda or auto")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
}

// Resolves the flag; cuda without a usable GPU is one clear error ("--device cuda: <reason>").
inline veloxquant::Device resolve_device(const std::string& flag) {
  try {
    const veloxquant::Device d = veloxquant::parse_device(flag);
    if (flag == "auto") {
      if (d == veloxquant::Device::cuda)
        std::fprintf(stderr, "device: cuda (%s)\n", veloxquant::cuda_device_description().c_str());
      else
        std::fprintf(stderr, "device: cpu (no usable GPU: %s)\n", veloxquant::cuda_unavailable_reason().c_str());
    }
    return d;
  } catch (const veloxquant::Error& e) {
    throw veloxquant::Error(std::string("--") + e.what());  // "--device cuda: <why>"
  }
}

}  // namespace vq::cli
