// SSA value names of the backward program: %q, %do, %delta, %k_smoothed, %q_int8, %p_int8, %s, %dp, %ds, %dv, ...
#include "BackwardDataflow.h"
#include "Dataflow.h"

#include <iterator>
#include <string>

namespace sage::ir {
namespace {

std::string originKeyword(mlir::Value value) {
  static constexpr const char *kKeywords[] = {"q", "k",  "v",     "o",  "lse", "do", "s",
                                              "p", "dp", "delta", "ds", "dv",  "dq", "dk"};
  static_assert(std::size(kKeywords) == static_cast<size_t>(backward::Origin::unknown));
  return dataflow::originNameIn(kKeywords, backward::originOf(value), "t");
}

} // namespace

void BwdInputOp::getAsmResultNames(mlir::OpAsmSetValueNameFn setName) {
  setName(getResult(), stringifyBackwardRole(getRole()));
}
void BwdSmoothOp::getAsmResultNames(mlir::OpAsmSetValueNameFn setName) {
  setName(getResult(), originKeyword(getInput()) + "_smoothed");
}
void BwdRowDotOp::getAsmResultNames(mlir::OpAsmSetValueNameFn setName) { setName(getResult(), "delta"); }
void BwdQuantizeOp::getAsmResultNames(mlir::OpAsmSetValueNameFn setName) {
  setName(getResult(), originKeyword(getInput()) + "_" + stringifyElementType(getDtype()).str());
}
void BwdMmaOp::getAsmResultNames(mlir::OpAsmSetValueNameFn setName) {
  setName(getResult(), originKeyword(getResult()));
}
void BwdMaskOp::getAsmResultNames(mlir::OpAsmSetValueNameFn setName) { setName(getResult(), "s_masked"); }
void BwdRecomputePOp::getAsmResultNames(mlir::OpAsmSetValueNameFn setName) { setName(getResult(), "p"); }
void BwdDsOp::getAsmResultNames(mlir::OpAsmSetValueNameFn setName) { setName(getResult(), "ds"); }

} // namespace sage::ir
