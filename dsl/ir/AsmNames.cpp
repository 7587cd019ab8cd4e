// SSA value names in printed IR, after the algorithm's steps: %q, %k_smoothed, %q_int8, %s, %p, %o...
#include "Dataflow.h"
#include "sage/ir/Dialect.h"

#include <iterator>
#include <string>

namespace sage::ir {
namespace {

std::string roleName(mlir::Value value) {
  static constexpr const char *kKeywords[] = {"q", "k", "v", "p", "s", "o"};
  static_assert(std::size(kKeywords) == static_cast<size_t>(dataflow::Origin::unknown));
  return dataflow::originNameIn(kKeywords, dataflow::originOf(value), "t");
}

} // namespace

void InputOp::getAsmResultNames(mlir::OpAsmSetValueNameFn setName) {
  setName(getResult(), stringifyTensorRole(getRole()));
}
void SmoothOp::getAsmResultNames(mlir::OpAsmSetValueNameFn setName) {
  setName(getResult(), roleName(getInput()) + "_smoothed");
}
void QuantizeOp::getAsmResultNames(mlir::OpAsmSetValueNameFn setName) {
  setName(getResult(), roleName(getInput()) + "_" + stringifyElementType(getDtype()).str());
}
void DecodeOp::getAsmResultNames(mlir::OpAsmSetValueNameFn setName) {
  setName(getResult(), roleName(getInput()) + "_decoded_" + stringifyElementType(getDtype()).str());
}
void QMeanCorrectionOp::getAsmResultNames(mlir::OpAsmSetValueNameFn setName) { setName(getResult(), "s_corrected"); }
void MmaOp::getAsmResultNames(mlir::OpAsmSetValueNameFn setName) {
  setName(getResult(), roleName(getResult()) == "s" ? "s" : "pv");
}
void DequantOp::getAsmResultNames(mlir::OpAsmSetValueNameFn setName) {
  setName(getResult(), roleName(getResult()) == "s" ? "s_dequant" : "pv_dequant");
}
void MaskOp::getAsmResultNames(mlir::OpAsmSetValueNameFn setName) { setName(getResult(), "s_masked"); }
void OnlineSoftmaxOp::getAsmResultNames(mlir::OpAsmSetValueNameFn setName) { setName(getResult(), "p"); }
void AccumulateOp::getAsmResultNames(mlir::OpAsmSetValueNameFn setName) { setName(getResult(), "o_accumulated"); }
void NormalizeOp::getAsmResultNames(mlir::OpAsmSetValueNameFn setName) { setName(getResult(), "o"); }
// SLA (issue 13)
void PredictMaskOp::getAsmResultNames(mlir::OpAsmSetValueNameFn setName) { setName(getResult(), "block_classes"); }
void LinearBranchOp::getAsmResultNames(mlir::OpAsmSetValueNameFn setName) { setName(getResult(), "o_linear"); }
void SlaCombineOp::getAsmResultNames(mlir::OpAsmSetValueNameFn setName) { setName(getResult(), "o_sla"); }

} // namespace sage::ir
