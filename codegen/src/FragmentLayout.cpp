#include "sage/codegen/FragmentLayout.h"

#include <stdexcept>
#include <string>

namespace sage::codegen {
namespace {

constexpr int kWarpSize = 32;
constexpr int kThreadsPerGroup = 4; // the PTX tables' "threadID_in_group" ranges over 4 lanes
constexpr int kLdmatrixRows = 8;

int operandBits(const schedules::MmaShape &shape, MmaOperand operand) {
  switch (operand) {
  case MmaOperand::a:
    return 8 * schedules::bytesOf(shape.a);
  case MmaOperand::b:
    return 8 * schedules::bytesOf(shape.b);
  case MmaOperand::accumulator:
    return shape.accumulator == AccumulatorType::f16 ? 16 : 32;
  }
  return 32;
}

void requireSupportedShape(const schedules::MmaShape &shape) {
  const bool k16_16bit = shape.m == 16 && shape.n == 8 && shape.k == 16 && schedules::bytesOf(shape.a) == 2;
  const bool k32_8bit = shape.m == 16 && shape.n == 8 && shape.k == 32 && schedules::bytesOf(shape.a) == 1;
  if (!k16_16bit && !k32_8bit)
    throw std::invalid_argument(
        "fragment layout: expected m16n8k16 with 16-bit or m16n8k32 with 8-bit operands, got m" +
        std::to_string(shape.m) + "n" + std::to_string(shape.n) + "k" + std::to_string(shape.k));
}

} // namespace

int elementsPerRegister(const schedules::MmaShape &shape, MmaOperand operand) {
  return 32 / operandBits(shape, operand);
}

int fragmentElements(const schedules::MmaShape &shape, MmaOperand operand) {
  switch (operand) {
  case MmaOperand::a:
    return shape.m * shape.k / kWarpSize;
  case MmaOperand::b:
    return shape.k * shape.n / kWarpSize;
  case MmaOperand::accumulator:
    return shape.m * shape.n / kWarpSize;
  }
  return 0;
}

int fragmentRegisters(const schedules::MmaShape &shape, MmaOperand operand) {
  return fragmentElements(shape, operand) / elementsPerRegister(shape, operand);
}

MatrixCoordinate fragmentCoordinate(const schedules::MmaShape &shape, MmaOperand operand, int lane, int element) {
  requireSupportedShape(shape);
  if (lane < 0 || lane >= kWarpSize)
    throw std::invalid_argument("fragment layout: lane must be 0..31, got " + std::to_string(lane));
  if (element < 0 || element >= fragmentElements(shape, operand))
    throw std::invalid_argument("fragment layout: element " + std::to_string(element) + " out of range");
  const int group = lane / kThreadsPerGroup;           // groupID
  const int thread_in_group = lane % kThreadsPerGroup; // threadID_in_group
  switch (operand) {
  case MmaOperand::accumulator: // c0, c1: row g; c2, c3: row g + 8; columns 2t, 2t + 1
    return {group + 8 * (element / 2), thread_in_group * 2 + element % 2};
  case MmaOperand::a: {
    // Per register: elements_per_register consecutive k. Registers: (row g, k lo), (g+8, k lo), (g, k hi), (g+8, k hi).
    const int per_register = elementsPerRegister(shape, operand);
    const int reg = element / per_register, within = element % per_register;
    return {group + 8 * (reg % 2), (reg / 2) * (shape.k / 2) + thread_in_group * per_register + within};
  }
  case MmaOperand::b: {
    // Column n = g; register 0 holds k in the lower half, register 1 the upper half.
    const int per_register = elementsPerRegister(shape, operand);
    const int reg = element / per_register, within = element % per_register;
    return {reg * (shape.k / 2) + thread_in_group * per_register + within, group};
  }
  }
  return {};
}

MatrixCoordinate ldmatrixCoordinate(int lane, int element, bool transposed) {
  if (lane < 0 || lane >= kWarpSize || element < 0 || element > 1)
    throw std::invalid_argument("ldmatrix layout: lane 0..31 and element 0..1 expected");
  const int group = lane / kThreadsPerGroup, thread_in_group = lane % kThreadsPerGroup;
  if (transposed) // the thread gets column g, rows 2t and 2t + 1
    return {thread_in_group * 2 + element, group};
  return {group, thread_in_group * 2 + element};
}

int ldmatrixAddressLane(int matrix, int row) {
  if (matrix < 0 || matrix > 3 || row < 0 || row >= kLdmatrixRows)
    throw std::invalid_argument("ldmatrix address: matrix 0..3 and row 0..7 expected");
  return matrix * kLdmatrixRows + row;
}

int scoreColumnToken(bool interleaved, int tile, int column) {
  constexpr int kColumns = 8, kStepTokens = 32, kTilesPerStep = kStepTokens / kColumns;
  if (!interleaved)
    return tile * kColumns + column;
  const int step = tile / kTilesPerStep, tile_in_step = tile % kTilesPerStep;
  return step * kStepTokens + (tile_in_step / 2) * (kStepTokens / 2) + (column / 2) * 4 + (tile_in_step % 2) * 2 +
         column % 2;
}

} // namespace sage::codegen
