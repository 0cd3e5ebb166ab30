// The CPU backend(s) in the parity harness: the default fused encoder (distance form chosen by
// codebook size) and the encoder forced to each distance form, so both are checked at every width.
#include "backends.h"
#include "ops/cpu/pq.h"

namespace vq::test {
namespace {

OpsBackend cpu_backend(const char* name, cpu::PQDistance dist) {
  OpsBackend b;
  b.name = name;
  b.pq_encode = [dist](const PQShape& s, const float* x, const float* books, uint16_t* codes) {
    if (dist == cpu::PQDistance::auto_select) return cpu::pq_encode(s, x, books, codes);
    check_pq_shape(s, "cpu::pq_encode");
    cpu::PQEncoder(s, books, dist).encode(x, s.n, codes);
  };
  b.pq_decode = [](const PQShape& s, const uint16_t* codes, const float* books, float* out) {
    cpu::pq_decode(s, codes, books, out);
  };
  return b;
}

}  // namespace

VQ_REGISTER_OPS_BACKEND(cpu_backend("cpu", cpu::PQDistance::auto_select));
VQ_REGISTER_OPS_BACKEND(cpu_backend("cpu_direct", cpu::PQDistance::direct));
VQ_REGISTER_OPS_BACKEND(cpu_backend("cpu_dot", cpu::PQDistance::dot));

}  // namespace vq::test
