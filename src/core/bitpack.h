#pragma once
// Bit-packed code rows (API.md). A row of n codes of b bits (b in 1..16) is packed LSB-first
// into ceil(n*b/8) bytes: code i occupies bits [i*b, (i+1)*b) of the row's little-endian bit
// stream (byte j holds bits 8j..8j+7, bit 0 = LSB). b=8: one byte per code; b=4: two per byte,
// low nibble first; b=12: two codes per 3 bytes.
#include <cstddef>
#include <cstdint>

namespace vq {

// Bytes of one packed row. Throws vq::Error unless n >= 0 and bits in 1..16.
size_t packed_row_bytes(int n, int bits);

// codes: [n] uint16, each < 2^bits (higher bits are an error); out: [packed_row_bytes(n, bits)].
// Padding bits of the last byte are written as zero.
void pack_codes(const uint16_t* codes, int n, int bits, uint8_t* out);
// in: [packed_row_bytes(n, bits)]; codes: [n] uint16.
void unpack_codes(const uint8_t* in, int n, int bits, uint16_t* codes);

// Code i of a packed row, any width 1..16 (no checks: hot path). Reads only bytes of the row.
inline uint32_t read_code(const uint8_t* row, int i, int bits) {
  if (bits == 8) return row[i];
  const size_t bit = size_t(i) * size_t(bits);
  const uint8_t* p = row + (bit >> 3);
  const unsigned shift = unsigned(bit & 7);
  const unsigned need = shift + unsigned(bits);  // bits to read starting at p, <= 23
  uint32_t v = p[0];
  if (need > 8) v |= uint32_t(p[1]) << 8;
  if (need > 16) v |= uint32_t(p[2]) << 16;
  return (v >> shift) & ((1u << bits) - 1u);
}

}  // namespace vq
