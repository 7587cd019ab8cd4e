#include "Dataflow.h"

namespace sage::ir::dataflow {

const char *originName(Origin origin) {
  switch (origin) {
  case Origin::q:
    return "Q";
  case Origin::k:
    return "K";
  case Origin::v:
    return "V";
  case Origin::p:
    return "P";
  case Origin::scores:
    return "the scores S";
  case Origin::output:
    return "the output O";
  case Origin::unknown:
    break;
  }
  return "an unknown value";
}

Origin originOf(mlir::Value value) {
  mlir::Operation *producer = value.getDefiningOp();
  if (!producer)
    return Origin::unknown;
  if (auto input = mlir::dyn_cast<InputOp>(producer)) {
    switch (input.getRole()) {
    case TensorRole::q:
      return Origin::q;
    case TensorRole::k:
      return Origin::k;
    case TensorRole::v:
      return Origin::v;
    }
    return Origin::unknown;
  }
  if (auto smooth = mlir::dyn_cast<SmoothOp>(producer))
    return originOf(smooth.getInput());
  if (auto quantize = mlir::dyn_cast<QuantizeOp>(producer))
    return originOf(quantize.getInput());
  if (mlir::isa<OnlineSoftmaxOp>(producer))
    return Origin::p;
  if (auto mma = mlir::dyn_cast<MmaOp>(producer))
    return originOf(mma.getLhs()) == Origin::p ? Origin::output : Origin::scores;
  if (auto dequant = mlir::dyn_cast<DequantOp>(producer))
    return originOf(dequant.getInput());
  if (auto mask = mlir::dyn_cast<MaskOp>(producer))
    return originOf(mask.getInput());
  if (mlir::isa<AccumulateOp, NormalizeOp>(producer))
    return Origin::output;
  return Origin::unknown;
}

QuantizeOp quantizerOf(mlir::Value value) { return value.getDefiningOp<QuantizeOp>(); }

MmaOp mmaBehind(mlir::Value value) {
  mlir::Operation *producer = value.getDefiningOp();
  while (producer) {
    if (auto mma = mlir::dyn_cast<MmaOp>(producer))
      return mma;
    if (auto dequant = mlir::dyn_cast<DequantOp>(producer))
      producer = dequant.getInput().getDefiningOp();
    else if (auto mask = mlir::dyn_cast<MaskOp>(producer))
      producer = mask.getInput().getDefiningOp();
    else
      return nullptr;
  }
  return nullptr;
}

bool operandsCarryScales(MmaOp mma) {
  for (mlir::Value operand : {mma.getLhs(), mma.getRhs()}) {
    QuantizeOp quantize = quantizerOf(operand);
    if (quantize && (quantize.getGranularity() != Granularity::none || quantize.getStaticScale()))
      return true;
  }
  return false;
}

} // namespace sage::ir::dataflow
