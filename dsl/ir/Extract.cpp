// The one place that reads the meaning of a sage program; everything below the IR uses its result.
#include "Extract.h"

#include "Dataflow.h"

#include <stdexcept>
#include <string>

namespace sage::ir {
namespace {

using dataflow::Origin;

// The dialect's enums mirror the vocabulary's case for case; map them by their shared spelling.
template <typename Result> Result mapByName(std::optional<Result> mapped, llvm::StringRef name) {
  if (!mapped)
    throw std::logic_error("sage dialect keyword '" + name.str() + "' has no AttentionVariant counterpart");
  return *mapped;
}

sage::ElementType toVocabulary(ElementType type) {
  return mapByName(sage::parseElementType(stringifyElementType(type).str()), stringifyElementType(type));
}

QuantizerSpec toQuantizerSpec(QuantizeOp op) {
  QuantizerSpec spec;
  spec.dtype = toVocabulary(op.getDtype());
  spec.granularity = mapByName(sage::parseGranularity(stringifyGranularity(op.getGranularity()).str()),
                               stringifyGranularity(op.getGranularity()));
  spec.group_tokens = static_cast<int>(op.getGroupTokens());
  spec.scale_type = mapByName(sage::parseScaleType(stringifyScaleType(op.getScaleType()).str()),
                              stringifyScaleType(op.getScaleType()));
  spec.static_scale = op.getStaticScale() ? op.getStaticScale()->convertToDouble() : 0.0;
  spec.two_level = op.getTwoLevel();
  spec.fold_softmax_scale = op.getFoldSoftmaxScale();
  if (mlir::IntegerAttr seed = op.getRotationSeedAttr()) // range-checked by the verifier (verifyRotation)
    spec.rotation_seed = static_cast<uint32_t>(seed.getInt());
  return spec;
}

} // namespace

AttentionVariant extractVariant(AttentionOp attention) {
  AttentionVariant variant;
  variant.name = attention.getSymName().str();
  variant.version = static_cast<int>(attention.getVersion());
  variant.head_dim = static_cast<int>(attention.getHeadDim());
  variant.block_q = static_cast<int>(attention.getBlockQ());
  variant.block_kv = static_cast<int>(attention.getBlockKv());
  variant.packed_sequences = attention.getPackedSequences();

  for (mlir::Operation &op : attention.getBody().front()) {
    if (auto smooth = mlir::dyn_cast<SmoothOp>(op)) {
      sage::SmoothScope scope = mapByName(sage::parseSmoothScope(stringifySmoothScope(smooth.getScope()).str()),
                                          stringifySmoothScope(smooth.getScope()));
      Origin origin = dataflow::originOf(smooth.getInput());
      (origin == Origin::q ? variant.smooth_q : origin == Origin::k ? variant.smooth_k : variant.smooth_v) = scope;
    } else if (auto quantize = mlir::dyn_cast<QuantizeOp>(op)) {
      switch (dataflow::originOf(quantize.getInput())) {
      case Origin::q:
        variant.q = toQuantizerSpec(quantize);
        break;
      case Origin::k:
        variant.k = toQuantizerSpec(quantize);
        break;
      case Origin::v:
        variant.v = toQuantizerSpec(quantize);
        break;
      default:
        variant.p = toQuantizerSpec(quantize);
        break;
      }
    } else if (auto mma = mlir::dyn_cast<MmaOp>(op)) {
      MatmulSpec spec;
      // The types the mma multiplies: a sage.decode's (a legalized program) or the quantizer's.
      spec.a = toVocabulary(dataflow::operandType(mma.getLhs()));
      spec.b = toVocabulary(dataflow::operandType(mma.getRhs()));
      spec.accumulator = mapByName(sage::parseAccumulatorType(stringifyAccumulatorType(mma.getAccumulator()).str()),
                                   stringifyAccumulatorType(mma.getAccumulator()));
      (dataflow::originOf(mma.getResult()) == Origin::scores ? variant.qk : variant.pv) = spec;
    } else if (auto mask = mlir::dyn_cast<MaskOp>(op)) {
      variant.mask.kind =
          mapByName(sage::parseMaskKind(stringifyMaskKind(mask.getKind()).str()), stringifyMaskKind(mask.getKind()));
    } else if (auto softmax = mlir::dyn_cast<OnlineSoftmaxOp>(op)) {
      variant.exp2_softmax = softmax.getBase() == SoftmaxBase::exp2;
    } else if (auto accumulate = mlir::dyn_cast<AccumulateOp>(op)) {
      variant.accumulation.kind =
          mapByName(sage::parseAccumulationKind(stringifyAccumulationKind(accumulate.getKind()).str()),
                    stringifyAccumulationKind(accumulate.getKind()));
      variant.accumulation.flush_period = static_cast<int>(accumulate.getFlushPeriod());
    } else if (auto prediction = mlir::dyn_cast<PredictMaskOp>(op)) { // SLA (issue 13)
      variant.sla.enabled = true;
      variant.sla.critical_percent = prediction.getCriticalPercent().convertToDouble();
      variant.sla.negligible_percent = prediction.getNegligiblePercent().convertToDouble();
    } else if (auto branch = mlir::dyn_cast<LinearBranchOp>(op)) {
      variant.sla.feature_map = mapByName(sage::parseFeatureMap(stringifyFeatureMap(branch.getFeatureMap()).str()),
                                          stringifyFeatureMap(branch.getFeatureMap()));
    } else if (auto lse = mlir::dyn_cast<WriteLseOp>(op)) {
      variant.epilogue.write_lse = true;
      variant.epilogue.lse_smoothing_correction = lse.getSmoothingCorrection();
    }
  }
  return variant;
}

} // namespace sage::ir
