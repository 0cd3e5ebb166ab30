#pragma once
// x[i] <- M x[i] for n rows of D floats (row i at x + i * stride), M [D][D] row-major, in place,
// such that a row's result does not depend on n or on the other rows: each output is one fixed
// chain of vector FMAs over the columns and one fixed lane reduction, the same whether the row is
// transformed alone (a decode step's query) or among thousands (a prefill chunk). A BLAS-style
// product picks its kernel and summation order by the matrix sizes, so a query transformed alone
// and in a chunk differed in its last bits, and with them the tokens of a batch-invariant run
// (docs/DETERMINISM.md). Highway, runtime dispatch.
#include <cstdint>

namespace vq::cpu {

void map_rows(const float* M, float* x, int64_t n, int D, int64_t stride);

}  // namespace vq::cpu
