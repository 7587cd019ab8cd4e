#include "Dataflow.h"

#include <iterator>

namespace sage::ir::dataflow {

const char *originName(Origin origin) {
  // In the order of Origin's enumerators, up to unknown.
  static constexpr const char *kNames[] = {"Q", "K", "V", "P", "the scores S", "the output O"};
  static_assert(std::size(kNames) == static_cast<size_t>(Origin::unknown));
  return dataflow::originNameIn(kNames, origin);
}

mlir::Operation *earlierProducer(mlir::Value value, mlir::Operation *user) {
  mlir::Operation *producer = value.getDefiningOp();
  if (!producer || !user || producer->getBlock() != user->getBlock() || producer == user ||
      !producer->isBeforeInBlock(user))
    return nullptr;
  return producer;
}

namespace {

Origin originOfProducer(mlir::Operation *producer, int steps);

// The origin of `operand` of `user`, stepping only to an earlier op: each walk ends.
Origin originThrough(mlir::Value operand, mlir::Operation *user, int steps) {
  return steps >= kMaxWalkSteps ? Origin::unknown : originOfProducer(earlierProducer(operand, user), steps + 1);
}

Origin originOfProducer(mlir::Operation *producer, int steps) {
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
    return originThrough(smooth.getInput(), producer, steps);
  if (auto quantize = mlir::dyn_cast<QuantizeOp>(producer))
    return originThrough(quantize.getInput(), producer, steps);
  if (auto decode = mlir::dyn_cast<DecodeOp>(producer))
    return originThrough(decode.getInput(), producer, steps);
  if (auto correction = mlir::dyn_cast<QMeanCorrectionOp>(producer))
    return originThrough(correction.getInput(), producer, steps);
  if (mlir::isa<OnlineSoftmaxOp>(producer))
    return Origin::p;
  if (auto mma = mlir::dyn_cast<MmaOp>(producer))
    return originThrough(mma.getLhs(), producer, steps) == Origin::p ? Origin::output : Origin::scores;
  if (auto dequant = mlir::dyn_cast<DequantOp>(producer))
    return originThrough(dequant.getInput(), producer, steps);
  if (auto mask = mlir::dyn_cast<MaskOp>(producer))
    return originThrough(mask.getInput(), producer, steps);
  if (mlir::isa<AccumulateOp, NormalizeOp, LinearBranchOp, SlaCombineOp>(producer))
    return Origin::output;
  return Origin::unknown;
}

} // namespace

Origin originOf(mlir::Value value) { return originOfProducer(value.getDefiningOp(), 0); }

QuantizeOp quantizerOf(mlir::Value value) {
  if (auto decode = value.getDefiningOp<DecodeOp>())
    return mlir::dyn_cast_or_null<QuantizeOp>(earlierProducer(decode.getInput(), decode));
  return value.getDefiningOp<QuantizeOp>();
}

ElementType operandType(mlir::Value value) {
  if (auto decode = value.getDefiningOp<DecodeOp>())
    return decode.getDtype();
  return quantizerOf(value).getDtype();
}

MmaOp mmaBehind(mlir::Value value) {
  mlir::Operation *producer = value.getDefiningOp();
  for (int steps = 0; producer && steps < kMaxWalkSteps; ++steps) {
    if (auto mma = mlir::dyn_cast<MmaOp>(producer))
      return mma;
    if (auto dequant = mlir::dyn_cast<DequantOp>(producer))
      producer = earlierProducer(dequant.getInput(), producer);
    else if (auto mask = mlir::dyn_cast<MaskOp>(producer))
      producer = earlierProducer(mask.getInput(), producer);
    else if (auto correction = mlir::dyn_cast<QMeanCorrectionOp>(producer))
      producer = earlierProducer(correction.getInput(), producer);
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
