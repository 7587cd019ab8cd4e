// SSA value names of the backward program: %q, %do, %delta, %k_smoothed, %q_int8, %p_int8, %s, %dp, %ds, %dv, ...
#include "BackwardDataflow.h"

#include <string>

namespace sage::ir {
namespace {

std::string originKeyword(mlir::Value value) {
  switch (backward::originOf(value)) {
  case backward::Origin::q:
    return "q";
  case backward::Origin::k:
    return "k";
  case backward::Origin::v:
    return "v";
  case backward::Origin::o:
    return "o";
  case backward::Origin::lse:
    return "lse";
  case backward::Origin::d_o:
    return "do";
  case backward::Origin::s:
    return "s";
  case backward::Origin::p:
    return "p";
  case backward::Origin::dp:
    return "dp";
  case backward::Origin::delta:
    return "delta";
  case backward::Origin::ds:
    return "ds";
  case backward::Origin::dv:
    return "dv";
  case backward::Origin::dq:
    return "dq";
  case backward::Origin::dk:
    return "dk";
  case backward::Origin::unknown:
    break;
  }
  return "t";
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
