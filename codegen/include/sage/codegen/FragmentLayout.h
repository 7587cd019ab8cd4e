// Which thread of a warp holds which element of an mma.sync operand, and which element ldmatrix delivers to
// which thread: the PTX ISA's "Matrix Fragments for mma.m16n8k16 / mma.m16n8k32" and "ldmatrix" tables, written
// once. The kernel generator's index arithmetic is derived from (and tested against) these functions.
#pragma once

#include "sage/schedules/KernelPlan.h"

namespace sage::codegen {

enum class MmaOperand { a, b, accumulator };

struct MatrixCoordinate {
  int row = 0;
  int column = 0;
  bool operator==(const MatrixCoordinate &) const = default;
};

// Elements of `operand` each thread holds, and how many share one 32-bit register (4 for 8-bit operands, 2 for
// 16-bit ones and for an f16 accumulator, 1 for s32/f32 accumulators).
int fragmentElements(const schedules::MmaShape &shape, MmaOperand operand);
int elementsPerRegister(const schedules::MmaShape &shape, MmaOperand operand);
int fragmentRegisters(const schedules::MmaShape &shape, MmaOperand operand);

// (row, column) in the operand's own matrix (A: m x k, B: k x n, accumulator: m x n) of element `element`
// (numbered register by register, lowest bits first) held by thread `lane`. Supports m16n8k16 with 16-bit
// operands and m16n8k32 with 8-bit operands. Throws std::invalid_argument for other shapes or indices.
MatrixCoordinate fragmentCoordinate(const schedules::MmaShape &shape, MmaOperand operand, int lane, int element);

// ldmatrix of 8x8 matrices of 16-bit elements: element `element` (0 or 1) of the register a thread receives from
// one matrix sits at this (row, column) of that matrix; `transposed` is ldmatrix's .trans.
MatrixCoordinate ldmatrixCoordinate(int lane, int element, bool transposed);

// ldmatrix .x1/.x2/.x4: the lane whose address names row `row` of matrix `matrix` (lanes 8i..8i+7 for matrix i).
int ldmatrixAddressLane(int matrix, int row);

// The KV token (within its block) that column `column` of n8 tile `tile` of S holds in the generated kernel
// (kv_token_of_column there). Plain: tile * 8 + column. Interleaved (8-bit P.V): within each 32-token k step,
// column 2c + b of tile 2h + s holds token 16h + 4c + 2s + b, so that two S tiles pack into one m16n8k32 A
// register without moving data between threads.
int scoreColumnToken(bool interleaved, int tile, int column);

} // namespace sage::codegen
