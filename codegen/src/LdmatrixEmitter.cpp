// ldmatrix wrappers: 1, 2 or 4 8x8 matrices of 16-bit elements from shared memory into one register each.
#include "sage/codegen/PtxEmitters.h"

#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace sage::codegen {
namespace {

void requireMatrices(int matrices) {
  if (matrices != 1 && matrices != 2 && matrices != 4)
    throw std::invalid_argument(fmt::format("ldmatrix: expected 1, 2 or 4 matrices, got {}", matrices));
}

} // namespace

std::string ldmatrixInstruction(int matrices, bool transposed) {
  requireMatrices(matrices);
  return fmt::format("ldmatrix.sync.aligned.m8n8.x{}{}.shared.b16", matrices, transposed ? ".trans" : "");
}

std::string ldmatrixFunctionName(int matrices, bool transposed) {
  requireMatrices(matrices);
  return fmt::format("ldmatrix_x{}{}", matrices, transposed ? "_trans" : "");
}

std::string emitLdmatrixFunction(int matrices, bool transposed) {
  requireMatrices(matrices);
  std::vector<std::string> registers, outputs;
  for (int i = 0; i < matrices; ++i) {
    registers.push_back(fmt::format("%{}", i));
    outputs.push_back(fmt::format("\"=r\"(fragment[{}])", i));
  }
  // volatile: the load must stay between the barriers that publish and recycle the shared tile.
  return fmt::format(
      R"(// fragment[i] = this lane's part of 8x8 matrix i; lanes 8i..8i+7 give the addresses of its rows{note}
__device__ __forceinline__ void {name}(unsigned (&fragment)[{count}], unsigned shared_address) {{
  asm volatile("{instruction} {{{registers}}}, [%{address}];\n" : {outputs} : "r"(shared_address));
}}
)",
      fmt::arg("note", transposed ? " (transposed)" : ""), fmt::arg("name", ldmatrixFunctionName(matrices, transposed)),
      fmt::arg("count", matrices), fmt::arg("instruction", ldmatrixInstruction(matrices, transposed)),
      fmt::arg("registers", fmt::join(registers, ", ")), fmt::arg("address", matrices),
      fmt::arg("outputs", fmt::join(outputs, ", ")));
}

} // namespace sage::codegen
