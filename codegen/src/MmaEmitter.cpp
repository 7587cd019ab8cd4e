// mma.sync wrappers: D = A.B + C with C and D in the same registers.
#include "sage/codegen/FragmentLayout.h"
#include "sage/codegen/PtxEmitters.h"

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace sage::codegen {
namespace {

using schedules::MmaShape;

std::string ptxType(ElementType type) {
  switch (type) {
  case ElementType::int8:
    return "s8";
  case ElementType::f16:
    return "f16";
  case ElementType::bf16:
    return "bf16";
  case ElementType::e4m3:
    return "e4m3";
  default:
    throw std::invalid_argument("mma operand type: expected int8, f16, bf16 or e4m3");
  }
}

std::string ptxType(AccumulatorType type) {
  switch (type) {
  case AccumulatorType::s32:
    return "s32";
  case AccumulatorType::f16:
    return "f16";
  case AccumulatorType::f32:
    return "f32";
  }
  return "f32";
}

void requireSupported(const MmaShape &shape) {
  const bool supported =
      shape.m == 16 && shape.n == 8 && shape.a == shape.b &&
      ((shape.k == 32 && shape.a == ElementType::int8 && shape.accumulator == AccumulatorType::s32) ||
       (shape.k == 32 && shape.a == ElementType::e4m3 && shape.accumulator == AccumulatorType::f32) ||
       (shape.k == 16 && shape.a == ElementType::f16 && shape.accumulator != AccumulatorType::s32) ||
       (shape.k == 16 && shape.a == ElementType::bf16 && shape.accumulator == AccumulatorType::f32));
  if (!supported)
    throw std::invalid_argument(fmt::format("mma shape m{}n{}k{} {} -> {} is not one the emitter supports", shape.m,
                                            shape.n, shape.k, ptxType(shape.a), ptxType(shape.accumulator)));
}

// "{%0, %1, %2, %3}" for `count` operands starting at `first`.
std::string operandList(int first, int count) {
  std::vector<std::string> names;
  for (int i = 0; i < count; ++i)
    names.push_back(fmt::format("%{}", first + i));
  return "{" + fmt::format("{}", fmt::join(names, ", ")) + "}";
}

} // namespace

std::string mmaInstruction(const MmaShape &shape) {
  requireSupported(shape);
  const std::string accumulator = ptxType(shape.accumulator);
  return fmt::format("mma.sync.aligned.m{}n{}k{}.row.col.{}.{}.{}.{}", shape.m, shape.n, shape.k, accumulator,
                     ptxType(shape.a), ptxType(shape.b), accumulator);
}

std::string mmaFunctionName(const MmaShape &shape) {
  requireSupported(shape);
  return fmt::format("mma_m{}n{}k{}_{}_{}", shape.m, shape.n, shape.k, ptxType(shape.a), ptxType(shape.accumulator));
}

std::string emitMmaFunction(const MmaShape &shape) {
  requireSupported(shape);
  const int accumulators = fragmentRegisters(shape, MmaOperand::accumulator);
  const int a_registers = fragmentRegisters(shape, MmaOperand::a);
  const int b_registers = fragmentRegisters(shape, MmaOperand::b);
  const bool float_accumulator = shape.accumulator == AccumulatorType::f32;
  const std::string accumulator_type =
      float_accumulator ? "float" : (shape.accumulator == AccumulatorType::s32 ? "int" : "unsigned");
  const std::string accumulator_constraint = float_accumulator ? "+f" : "+r";

  std::vector<std::string> outputs, inputs;
  for (int i = 0; i < accumulators; ++i)
    outputs.push_back(fmt::format("\"{}\"(accumulator[{}])", accumulator_constraint, i));
  for (int i = 0; i < a_registers; ++i)
    inputs.push_back(fmt::format("\"r\"(a[{}])", i));
  for (int i = 0; i < b_registers; ++i)
    inputs.push_back(fmt::format("\"r\"(b{})", i));

  const std::string d_operands = operandList(0, accumulators);
  const std::string a_operands = operandList(accumulators, a_registers);
  const std::string b_operands = operandList(accumulators + a_registers, b_registers);
  return fmt::format(R"(// accumulator += a . b: {instruction} (A row-major, B column-major; C and D share registers)
__device__ __forceinline__ void {name}({acc_type} (&accumulator)[{acc_count}], const unsigned (&a)[{a_count}], unsigned b0,
                                                 unsigned b1) {{
  asm("{instruction} {d}, {a}, {b}, {d};\n"
      : {outputs}
      : {inputs});
}}
)",
                     fmt::arg("instruction", mmaInstruction(shape)), fmt::arg("name", mmaFunctionName(shape)),
                     fmt::arg("acc_type", accumulator_type), fmt::arg("acc_count", accumulators),
                     fmt::arg("a_count", a_registers), fmt::arg("d", d_operands), fmt::arg("a", a_operands),
                     fmt::arg("b", b_operands), fmt::arg("outputs", fmt::join(outputs, ", ")),
                     fmt::arg("inputs", fmt::join(inputs, ", ")));
}

} // namespace sage::codegen
