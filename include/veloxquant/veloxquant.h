#pragma once
// The whole public API of VeloxQuant. Link VeloxQuant::veloxquant (CMake: find_package(VeloxQuant))
// or `pkg-config --cflags --libs veloxquant`; C++20.
#include "veloxquant/calibration.h"
#include "veloxquant/codec.h"
#include "veloxquant/config.h"
#include "veloxquant/engine.h"
#include "veloxquant/eval.h"
#include "veloxquant/files.h"
#include "veloxquant/generate.h"
#include "veloxquant/kv_cache.h"
#include "veloxquant/kv_spec.h"
#include "veloxquant/model.h"
#include "veloxquant/perplexity.h"
#include "veloxquant/runtime.h"
#include "veloxquant/sampling.h"
#include "veloxquant/session.h"
#include "veloxquant/status.h"
