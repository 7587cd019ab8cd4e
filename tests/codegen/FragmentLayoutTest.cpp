// Fragment layouts of the mma.sync shapes the kernels use, checked against the PTX ISA's "Matrix Fragments for
// mma.m16n8k16 / mma.m16n8k32" tables, and the identities the generated kernel relies on: ldmatrix delivers the
// fragments, and an S accumulator is the next mma's A fragment.
#include "sage/codegen/FragmentLayout.h"

#include <doctest/doctest.h>

#include <set>
#include <stdexcept>
#include <utility>

using namespace sage;
using namespace sage::codegen;
using schedules::MmaShape;

namespace {

const MmaShape kInt8{16, 8, 32, ElementType::int8, ElementType::int8, AccumulatorType::s32};
const MmaShape kE4m3{16, 8, 32, ElementType::e4m3, ElementType::e4m3, AccumulatorType::f32};
const MmaShape kF16{16, 8, 16, ElementType::f16, ElementType::f16, AccumulatorType::f32};
const MmaShape kF16Accumulate{16, 8, 16, ElementType::f16, ElementType::f16, AccumulatorType::f16};
const MmaShape kBf16{16, 8, 16, ElementType::bf16, ElementType::bf16, AccumulatorType::f32};

std::pair<int, int> matrixSize(const MmaShape &shape, MmaOperand operand) {
  switch (operand) {
  case MmaOperand::a:
    return {shape.m, shape.k};
  case MmaOperand::b:
    return {shape.k, shape.n};
  case MmaOperand::accumulator:
    return {shape.m, shape.n};
  }
  return {0, 0};
}

} // namespace

TEST_CASE("each operand element is held by exactly one (lane, element)") {
  for (const MmaShape &shape : {kInt8, kE4m3, kF16, kF16Accumulate, kBf16})
    for (MmaOperand operand : {MmaOperand::a, MmaOperand::b, MmaOperand::accumulator}) {
      const auto [rows, columns] = matrixSize(shape, operand);
      std::set<std::pair<int, int>> seen;
      for (int lane = 0; lane < 32; ++lane)
        for (int element = 0; element < fragmentElements(shape, operand); ++element) {
          const MatrixCoordinate at = fragmentCoordinate(shape, operand, lane, element);
          CHECK(at.row >= 0);
          CHECK(at.row < rows);
          CHECK(at.column >= 0);
          CHECK(at.column < columns);
          seen.insert({at.row, at.column});
        }
      CHECK(static_cast<int>(seen.size()) == rows * columns);
    }
}

TEST_CASE("register counts per thread") {
  CHECK(fragmentRegisters(kInt8, MmaOperand::a) == 4);
  CHECK(fragmentRegisters(kInt8, MmaOperand::b) == 2);
  CHECK(fragmentRegisters(kInt8, MmaOperand::accumulator) == 4);
  CHECK(fragmentRegisters(kF16, MmaOperand::a) == 4);
  CHECK(fragmentRegisters(kF16, MmaOperand::b) == 2);
  CHECK(fragmentRegisters(kF16Accumulate, MmaOperand::accumulator) == 2);
  CHECK(elementsPerRegister(kE4m3, MmaOperand::a) == 4);
  CHECK(elementsPerRegister(kBf16, MmaOperand::b) == 2);
}

TEST_CASE("m16n8k16 16-bit entries of the PTX tables") {
  // A: row = groupID for a0, a1, a4, a5 (else + 8); col = threadID_in_group * 2 + (i & 1) (+ 8 for i >= 4)
  CHECK(fragmentCoordinate(kF16, MmaOperand::a, 0, 0) == MatrixCoordinate{0, 0});
  CHECK(fragmentCoordinate(kF16, MmaOperand::a, 0, 3) == MatrixCoordinate{8, 1});
  CHECK(fragmentCoordinate(kF16, MmaOperand::a, 5, 0) == MatrixCoordinate{1, 2});
  CHECK(fragmentCoordinate(kF16, MmaOperand::a, 5, 5) == MatrixCoordinate{1, 11});
  CHECK(fragmentCoordinate(kF16, MmaOperand::a, 31, 7) == MatrixCoordinate{15, 15});
  // B: row = threadID_in_group * 2 + (i & 1) (+ 8 for i >= 2); col = groupID
  CHECK(fragmentCoordinate(kBf16, MmaOperand::b, 5, 0) == MatrixCoordinate{2, 1});
  CHECK(fragmentCoordinate(kBf16, MmaOperand::b, 5, 3) == MatrixCoordinate{11, 1});
  // C/D: row = groupID (+ 8 for c2, c3); col = threadID_in_group * 2 + (i & 1)
  CHECK(fragmentCoordinate(kF16, MmaOperand::accumulator, 6, 1) == MatrixCoordinate{1, 5});
  CHECK(fragmentCoordinate(kF16Accumulate, MmaOperand::accumulator, 6, 2) == MatrixCoordinate{9, 4});
}

TEST_CASE("m16n8k32 8-bit entries of the PTX tables") {
  // A: row = groupID for a0-a3 and a8-a11 (else + 8); col = threadID_in_group * 4 + (i & 3) (+ 16 for i >= 8)
  CHECK(fragmentCoordinate(kInt8, MmaOperand::a, 6, 0) == MatrixCoordinate{1, 8});
  CHECK(fragmentCoordinate(kInt8, MmaOperand::a, 6, 3) == MatrixCoordinate{1, 11});
  CHECK(fragmentCoordinate(kInt8, MmaOperand::a, 6, 4) == MatrixCoordinate{9, 8});
  CHECK(fragmentCoordinate(kInt8, MmaOperand::a, 6, 8) == MatrixCoordinate{1, 24});
  CHECK(fragmentCoordinate(kE4m3, MmaOperand::a, 6, 15) == MatrixCoordinate{9, 27});
  // B: row = threadID_in_group * 4 + (i & 3) (+ 16 for i >= 4); col = groupID
  CHECK(fragmentCoordinate(kInt8, MmaOperand::b, 6, 0) == MatrixCoordinate{8, 1});
  CHECK(fragmentCoordinate(kInt8, MmaOperand::b, 6, 7) == MatrixCoordinate{27, 1});
  CHECK(fragmentCoordinate(kE4m3, MmaOperand::accumulator, 31, 3) == MatrixCoordinate{15, 7});
}

TEST_CASE("invalid shapes and indices are rejected") {
  const MmaShape wrong{16, 8, 16, ElementType::int8, ElementType::int8, AccumulatorType::s32};
  CHECK_THROWS_AS(fragmentCoordinate(wrong, MmaOperand::a, 0, 0), std::invalid_argument);
  CHECK_THROWS_AS(fragmentCoordinate(kInt8, MmaOperand::a, 32, 0), std::invalid_argument);
  CHECK_THROWS_AS(fragmentCoordinate(kInt8, MmaOperand::a, 0, 16), std::invalid_argument);
  CHECK_THROWS_AS(ldmatrixCoordinate(0, 2, false), std::invalid_argument);
  CHECK_THROWS_AS(ldmatrixAddressLane(4, 0), std::invalid_argument);
}

TEST_CASE("ldmatrix layout: lanes own row g, b16 columns 2t and 2t + 1 (transposed: the converse)") {
  CHECK(ldmatrixCoordinate(13, 1, false) == MatrixCoordinate{3, 3});
  CHECK(ldmatrixCoordinate(13, 1, true) == MatrixCoordinate{3, 3});
  CHECK(ldmatrixCoordinate(6, 0, false) == MatrixCoordinate{1, 4});
  CHECK(ldmatrixCoordinate(6, 0, true) == MatrixCoordinate{4, 1});
  CHECK(ldmatrixAddressLane(2, 5) == 21);
}

// load_q_fragments: ldmatrix.x4 with matrix m = rows (m % 2) * 8.., bytes (m / 2) * 16.. of the k step. Register m of
// each lane must be the A fragment's register m, for 8-bit (k32) and 16-bit (k16) operands alike.
TEST_CASE("ldmatrix.x4 over a Q tile yields the A fragment") {
  for (const MmaShape &shape : {kInt8, kF16}) {
    const int element_bytes = schedules::bytesOf(shape.a);
    const int per_register = elementsPerRegister(shape, MmaOperand::a);
    for (int lane = 0; lane < 32; ++lane)
      for (int matrix = 0; matrix < 4; ++matrix)
        for (int element = 0; element < per_register; ++element) {
          const int byte = element * element_bytes;
          const MatrixCoordinate in_matrix = ldmatrixCoordinate(lane, byte / 2, false); // b16 units
          const int row = (matrix % 2) * 8 + in_matrix.row;
          const int column_byte = (matrix / 2) * 16 + in_matrix.column * 2 + byte % 2;
          CHECK(fragmentCoordinate(shape, MmaOperand::a, lane, matrix * per_register + element) ==
                MatrixCoordinate{row, column_byte / element_bytes});
        }
  }
}

// multiply_q_k: K's rows are tokens (n), bytes are channels (k). Matrix m covers tile (pair + m / 2), bytes
// (m % 2) * 16: registers (0, 1) are the B fragment of the first tile, (2, 3) of the second.
TEST_CASE("ldmatrix.x4 over a token-major K tile yields B fragments of two n8 tiles") {
  for (const MmaShape &shape : {kInt8, kF16}) {
    const int element_bytes = schedules::bytesOf(shape.b);
    const int per_register = elementsPerRegister(shape, MmaOperand::b);
    for (int lane = 0; lane < 32; ++lane)
      for (int matrix = 0; matrix < 4; ++matrix)
        for (int element = 0; element < per_register; ++element) {
          const int byte = element * element_bytes;
          const MatrixCoordinate in_matrix = ldmatrixCoordinate(lane, byte / 2, false);
          const int token = in_matrix.row;
          const int channel = ((matrix % 2) * 16 + in_matrix.column * 2 + byte % 2) / element_bytes;
          CHECK(fragmentCoordinate(shape, MmaOperand::b, lane, (matrix % 2) * per_register + element) ==
                MatrixCoordinate{channel, token});
        }
  }
}

// multiply_p_v (f16 V): token-major V, ldmatrix.trans; matrix m = tokens (m % 2) * 8.., channels of tile m / 2.
TEST_CASE("ldmatrix.x4.trans over a token-major V tile yields B fragments of m16n8k16") {
  for (int lane = 0; lane < 32; ++lane)
    for (int matrix = 0; matrix < 4; ++matrix)
      for (int element = 0; element < 2; ++element) {
        const MatrixCoordinate in_matrix = ldmatrixCoordinate(lane, element, true);
        const int token = (matrix % 2) * 8 + in_matrix.row, channel = in_matrix.column;
        CHECK(fragmentCoordinate(kF16, MmaOperand::b, lane, (matrix % 2) * 2 + element) ==
              MatrixCoordinate{token, channel});
      }
}

// load_v_fragments (8-bit V^T): channel-major rows, matrix m = tokens m * 16.. of one channel tile.
TEST_CASE("ldmatrix.x4 over a channel-major V^T tile yields the B fragments of two k32 steps") {
  for (int lane = 0; lane < 32; ++lane)
    for (int matrix = 0; matrix < 4; ++matrix)
      for (int byte = 0; byte < 4; ++byte) {
        const MatrixCoordinate in_matrix = ldmatrixCoordinate(lane, byte / 2, false);
        const int channel = in_matrix.row, token = matrix * 16 + in_matrix.column * 2 + byte % 2;
        const int step = matrix / 2;
        CHECK(fragmentCoordinate(kInt8, MmaOperand::b, lane, (matrix % 2) * 4 + byte) ==
              MatrixCoordinate{token - step * 32, channel});
      }
}

// pack_probabilities (f16): A register r of k step s takes accumulator elements (r % 2) * 2, +1 of S tile
// 2s + r / 2. The token those S elements hold must be the A fragment's k.
TEST_CASE("two S accumulator tiles are one m16n8k16 A fragment") {
  for (int lane = 0; lane < 32; ++lane)
    for (int reg = 0; reg < 4; ++reg)
      for (int element = 0; element < 2; ++element) {
        const int tile = reg / 2, accumulator_element = (reg % 2) * 2 + element;
        const MatrixCoordinate s = fragmentCoordinate(kF16, MmaOperand::accumulator, lane, accumulator_element);
        const int token = tile * 8 + scoreColumnToken(false, 0, s.column);
        CHECK(fragmentCoordinate(kF16, MmaOperand::a, lane, reg * 2 + element) == MatrixCoordinate{s.row, token});
      }
}

// pack_probabilities (8-bit): A register r of k step s takes elements (r % 2) * 2, +1 of S tiles 4s + 2 (r / 2) and
// 4s + 2 (r / 2) + 1, in that order. With interleaved columns those are the A fragment's 4 consecutive k.
TEST_CASE("four interleaved S accumulator tiles are one m16n8k32 A fragment") {
  for (int lane = 0; lane < 32; ++lane)
    for (int reg = 0; reg < 4; ++reg)
      for (int byte = 0; byte < 4; ++byte) {
        const int tile = 2 * (reg / 2) + byte / 2, accumulator_element = (reg % 2) * 2 + byte % 2;
        const MatrixCoordinate s = fragmentCoordinate(kInt8, MmaOperand::accumulator, lane, accumulator_element);
        const int token = scoreColumnToken(true, tile, s.column);
        CHECK(fragmentCoordinate(kInt8, MmaOperand::a, lane, reg * 4 + byte) == MatrixCoordinate{s.row, token});
      }
}

TEST_CASE("interleaved score columns are a permutation of each 32-token step") {
  std::set<int> tokens;
  for (int tile = 0; tile < 8; ++tile)
    for (int column = 0; column < 8; ++column)
      tokens.insert(scoreColumnToken(true, tile, column));
  CHECK(tokens.size() == 64);
  CHECK(*tokens.begin() == 0);
  CHECK(*tokens.rbegin() == 63);
  CHECK(scoreColumnToken(true, 4, 0) == 32); // step 1 starts at token 32
  CHECK(scoreColumnToken(true, 1, 0) == 2);
  CHECK(scoreColumnToken(false, 3, 5) == 29);
}
