#include "core/bitpack.h"


#include "core/error.h"

namespace vq {

size_t packed_row_bytes(int n, int bits) {
  VQ_CHECK(bits >= 1 && bits <= 16, "bitpack: bits = {} must be in 1..16", bits);
  VQ_CHECK(n >= 0, "bitpack: n = {} must be >= 0", n);
  return (size_t(n) * size_t(bits) + 7) / 8;
}

void pack_codes(const uint16_t* codes, int n, int bits, uint8_t* out) {
  (void)packed_row_bytes(n, bits);  // validates n and bits
  const uint32_t limit = 1u << bits;
  if (bits == 8) {
    for (int i = 0; i < n; ++i) {
      VQ_CHECK(codes[i] < limit, "pack_codes: code {} at {} does not fit in {} bits", codes[i], i, bits);
      out[i] = uint8_t(codes[i]);
    }
    return;
  }
  // A 64-bit accumulator: append each code above the pending bits, flush whole bytes.
  uint64_t acc = 0;
  unsigned pending = 0;
  size_t o = 0;
  for (int i = 0; i < n; ++i) {
    VQ_CHECK(codes[i] < limit, "pack_codes: code {} at {} does not fit in {} bits", codes[i], i, bits);
    acc |= uint64_t(codes[i]) << pending;
    pending += unsigned(bits);
    while (pending >= 8) {
      out[o++] = uint8_t(acc);
      acc >>= 8;
      pending -= 8;
    }
  }
  if (pending > 0) out[o++] = uint8_t(acc);
}

void unpack_codes(const uint8_t* in, int n, int bits, uint16_t* codes) {
  (void)packed_row_bytes(n, bits);
  if (bits == 8) {
    for (int i = 0; i < n; ++i) codes[i] = in[i];
    return;
  }
  const uint64_t mask = (uint64_t(1) << bits) - 1;
  uint64_t acc = 0;
  unsigned avail = 0;
  size_t p = 0;
  for (int i = 0; i < n; ++i) {
    while (avail < unsigned(bits)) {
      acc |= uint64_t(in[p++]) << avail;
      avail += 8;
    }
    codes[i] = uint16_t(acc & mask);
    acc >>= bits;
    avail -= unsigned(bits);
  }
}

}  // namespace vq
