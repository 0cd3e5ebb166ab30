// veloxquant._veloxquant: the Python face of the public C++ API (include/veloxquant).
#include <nanobind/stl/string.h>

#include "common.h"
#include "veloxquant/runtime.h"
#include "veloxquant/status.h"

NB_MODULE(_veloxquant, m) {
  namespace nb = nanobind;
  m.doc() = "VeloxQuant: compressed LLM KV caches (VecInfer, KIVI, q8_0/q4_0) and a llama-family GGUF runtime.";
  nb::exception<veloxquant::Error>(m, "Error", PyExc_RuntimeError);
  m.def("version", &veloxquant::version, "The library version, e.g. '0.1.0'.");
  m.def("set_num_threads", &veloxquant::set_num_threads, nb::arg("n"),
        "Sets the size of the process-wide worker pool (attention, matrix products).");
  m.def("num_threads", &veloxquant::num_threads, "Threads of the process-wide worker pool.");
  m.def("cuda_available", &veloxquant::cuda_available,
        "True when this build has the CUDA backend and a usable GPU is present.");
  vqpy::bind_codec(m);
  auto model = vqpy::bind_model(m);
  vqpy::bind_generate(m, model);
  vqpy::bind_engine(m);
  vqpy::bind_server(m);
}
