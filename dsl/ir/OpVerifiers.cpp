// Verifiers of the individual sage ops: each rule names the op, the attribute and what was expected.
// Rules that need the whole program (one input per role, an epilogue, ...) are in ProgramVerifier.cpp.
#include "Dataflow.h"
#include "VerifierSupport.h"
#include "sage/ir/AttentionVariant.h"
#include "sage/ir/Dialect.h"

namespace sage::ir {
namespace {

using dataflow::Origin;
using dataflow::originName;
using dataflow::originOf;
using detail::isCast;
using detail::signedValue;

// Elements sharing one microscale (16 for NVFP4, 32 for MXFP4), else 0.
int microscaleGroup(Granularity granularity) {
  return granularity == Granularity::microscale_1x16 ? 16 : granularity == Granularity::microscale_1x32 ? 32 : 0;
}

bool usesGroups(Granularity granularity) {
  return granularity == Granularity::per_block || granularity == Granularity::per_warp ||
         granularity == Granularity::per_thread;
}

// The tile size a quantizer's groups must divide: b_q for Q, b_kv for K.
int64_t tileTokensFor(QuantizeOp op, Origin origin) {
  auto attention = op->getParentOfType<AttentionOp>();
  if (!attention)
    return 0;
  return signedValue(origin == Origin::q ? attention.getBlockQAttr() : attention.getBlockKvAttr());
}

mlir::LogicalResult verifyDtypeAndGranularity(QuantizeOp op) {
  ElementType dtype = op.getDtype();
  Granularity granularity = op.getGranularity();
  bool is_static = op.getStaticScale().has_value();
  if (isCast(dtype) && granularity != Granularity::none)
    return op.emitOpError() << "casting to " << stringifyElementType(dtype)
                            << " takes no scale: granularity must be 'none', got '" << stringifyGranularity(granularity)
                            << "'";
  if (isCast(dtype) && is_static)
    return op.emitOpError() << "casting to " << stringifyElementType(dtype) << " takes no static_scale";
  if (!isCast(dtype) && granularity == Granularity::none && !is_static)
    return op.emitOpError() << "quantizing to " << stringifyElementType(dtype)
                            << " needs a scale: give a granularity other than 'none' or a static_scale";
  if ((dtype == ElementType::e2m1) != (microscaleGroup(granularity) > 0))
    return op.emitOpError()
           << "e2m1 (FP4) values and microscale_1x16 scales go together (microscale_1x32 for MXFP4), got dtype '"
           << stringifyElementType(dtype) << "' with granularity '" << stringifyGranularity(granularity) << "'";
  if ((op.getScaleType() == ScaleType::ue4m3) != (granularity == Granularity::microscale_1x16))
    return op.emitOpError() << "scale_type ue4m3 is the microscale_1x16 scale type (NVFP4) and only that; got "
                               "scale_type '"
                            << stringifyScaleType(op.getScaleType()) << "' with granularity '"
                            << stringifyGranularity(granularity) << "'";
  if ((op.getScaleType() == ScaleType::ue8m0) != (granularity == Granularity::microscale_1x32))
    return op.emitOpError() << "scale_type ue8m0 is the microscale_1x32 scale type (MXFP4) and only that; got "
                               "scale_type '"
                            << stringifyScaleType(op.getScaleType()) << "' with granularity '"
                            << stringifyGranularity(granularity) << "'";
  return mlir::success();
}

// Microscale groups lie along the reduction axis: head_dim for Q and K, the KV tile for P and V. A group may not
// straddle a tile (the mma's k extent), so the group size must divide it.
mlir::LogicalResult verifyMicroscaleExtent(QuantizeOp op, Origin origin) {
  const int group = microscaleGroup(op.getGranularity());
  auto attention = op->getParentOfType<AttentionOp>();
  if (group == 0 || !attention)
    return mlir::success();
  const bool along_head_dim = origin == Origin::q || origin == Origin::k;
  const int64_t extent = signedValue(along_head_dim ? attention.getHeadDimAttr() : attention.getBlockKvAttr());
  if (extent % group != 0)
    return op.emitOpError() << stringifyGranularity(op.getGranularity()) << " groups " << group << " elements along "
                            << (along_head_dim ? "head_dim" : "the KV tile") << " of " << originName(origin) << ": "
                            << (along_head_dim ? "head_dim" : "block_kv") << " must be a multiple of " << group
                            << ", got " << extent;
  return mlir::success();
}

mlir::LogicalResult verifyGroupTokens(QuantizeOp op, Origin origin) {
  int64_t group = signedValue(op.getGroupTokensAttr());
  Granularity granularity = op.getGranularity();
  if (!usesGroups(granularity)) {
    if (group != 0)
      return op.emitOpError() << "group_tokens is only meaningful for per_block, per_warp and per_thread, not '"
                              << stringifyGranularity(granularity) << "'";
    return mlir::success();
  }
  if (group <= 0 || group > kMaxBlockTokens)
    return op.emitOpError() << "granularity '" << stringifyGranularity(granularity) << "' needs group_tokens in [1, "
                            << kMaxBlockTokens << "] (tokens sharing one scale), got " << group;
  if (granularity == Granularity::per_thread && group % 8 != 0)
    return op.emitOpError() << "per_thread interleaves tokens by 8: group_tokens must be a multiple of 8, got "
                            << group;
  int64_t tile = tileTokensFor(op, origin);
  if (tile > 0 && tile % group != 0)
    return op.emitOpError() << "group_tokens " << group << " must divide the " << originName(origin) << " tile of "
                            << tile << " tokens";
  return mlir::success();
}

mlir::LogicalResult verifyRoleRules(QuantizeOp op, Origin origin) {
  Granularity granularity = op.getGranularity();
  ElementType dtype = op.getDtype();
  if (origin == Origin::unknown || origin == Origin::scores || origin == Origin::output)
    return op.emitOpError() << "quantizes " << originName(origin) << "; expected Q, K, V or P";
  if (granularity == Granularity::per_channel && origin != Origin::v)
    return op.emitOpError() << "per_channel scales of " << originName(origin)
                            << " lie on the inner axis of its matmul and cannot be factored out; only V may be "
                               "quantized per_channel";
  // One scale per whole KV tile (SageBwd's forward, Algorithm 2) still factors out of the tile's P.V.
  const bool v_scale_per_tile = granularity == Granularity::per_block && tileTokensFor(op, Origin::k) > 0 &&
                                signedValue(op.getGroupTokensAttr()) == tileTokensFor(op, Origin::k);
  if (origin == Origin::v && (granularity == Granularity::per_token || usesGroups(granularity)) && !v_scale_per_tile)
    return op.emitOpError() << "V's token axis is the inner axis of P.V: V may be quantized per_channel, "
                               "per_tensor, per_block with one scale per KV tile (group_tokens = block_kv) or "
                               "microscaled (along its tokens), not '"
                            << stringifyGranularity(granularity) << "'";
  if (origin == Origin::p && granularity != Granularity::none && granularity != Granularity::per_tensor &&
      granularity != Granularity::per_token && microscaleGroup(granularity) == 0)
    return op.emitOpError() << "P is quantized row by row as the softmax produces it: use a static_scale, per_token, "
                               "microscale_1x16 or microscale_1x32, not '"
                            << stringifyGranularity(granularity) << "'";
  if (origin == Origin::p && granularity == Granularity::per_tensor && !op.getStaticScale())
    return op.emitOpError() << "P has no whole-tensor amax while the softmax runs: per_tensor P needs a static_scale";
  if (dtype == ElementType::int4 && origin != Origin::q && origin != Origin::k)
    return op.emitOpError() << "int4 is for Q and K (SageAttention2); " << originName(origin) << " cannot be int4";
  if (op.getStaticScale()) {
    double scale = op.getStaticScale()->convertToDouble();
    if (origin != Origin::p)
      return op.emitOpError() << "a static_scale is only valid for P, whose rows have max 1; " << originName(origin)
                              << " needs a computed scale";
    if (!(scale >= kMinStaticScale && scale <= kMaxStaticScale))
      return op.emitOpError() << "static_scale must lie in [2^-64, 2^64] (a normal f32 whose reciprocal is one too), "
                                 "got "
                              << scale;
    if (granularity != Granularity::per_tensor)
      return op.emitOpError() << "a static_scale is one scale for the whole tensor: granularity must be "
                                 "'per_tensor', got '"
                              << stringifyGranularity(granularity) << "'";
  }
  if (op.getTwoLevel() && !(origin == Origin::p && granularity == Granularity::microscale_1x16))
    return op.emitOpError() << "two_level scaling is SageAttention3's P quantization: it needs P in e2m1 with "
                               "microscale_1x16 (its per-row scale fills the UE4M3 microscales' range)";
  if (op.getFoldSoftmaxScale() && origin != Origin::q)
    return op.emitOpError() << "fold_softmax_scale multiplies Q by 1/sqrt(d); it cannot be set on "
                            << originName(origin);
  return mlir::success();
}

// Operand pairs the tensor cores support, and the accumulator each needs.
mlir::LogicalResult verifyMmaTypes(MmaOp op, ElementType lhs, ElementType rhs) {
  AccumulatorType accumulator = op.getAccumulator();
  auto expect = [&](std::initializer_list<AccumulatorType> allowed, const char *allowed_text) -> mlir::LogicalResult {
    for (AccumulatorType candidate : allowed)
      if (candidate == accumulator)
        return mlir::success();
    return op.emitOpError() << "mma of " << stringifyElementType(lhs) << " operands accumulates in " << allowed_text
                            << ", not '" << stringifyAccumulatorType(accumulator) << "'";
  };
  auto is_fp8 = [](ElementType type) { return type == ElementType::e4m3 || type == ElementType::e5m2; };
  bool fp8_pair = is_fp8(lhs) && is_fp8(rhs);
  if (lhs != rhs && !fp8_pair)
    return op.emitOpError() << "operand types " << stringifyElementType(lhs) << " and " << stringifyElementType(rhs)
                            << " cannot be mixed in one mma";
  switch (lhs) {
  case ElementType::int8:
  case ElementType::int4:
    return expect({AccumulatorType::s32}, "s32");
  case ElementType::f16:
    return expect({AccumulatorType::f16, AccumulatorType::f32}, "f16 or f32");
  default:
    return expect({AccumulatorType::f32}, "f32");
  }
}

} // namespace

mlir::LogicalResult AttentionOp::verify() { return detail::verifyProgramAttributes(*this); }

mlir::LogicalResult InputOp::verify() { return mlir::success(); }

mlir::LogicalResult SmoothOp::verify() {
  if (!getInput().getDefiningOp<InputOp>())
    return emitOpError() << "smooths a raw input: its operand must come from sage.input";
  Origin origin = originOf(getInput());
  SmoothScope expected = origin == Origin::q ? SmoothScope::block : SmoothScope::sequence;
  if (getScope() != expected)
    return emitOpError() << "smoothing " << originName(origin) << " is over the " << stringifySmoothScope(expected)
                         << " ("
                         << (origin == Origin::q ? "SageAttention2's per-block Q mean" : "the mean over all tokens")
                         << "), not the " << stringifySmoothScope(getScope());
  return mlir::success();
}

mlir::LogicalResult QuantizeOp::verify() {
  if (mlir::Operation *producer = dataflow::earlierProducer(getInput(), *this);
      mlir::isa_and_nonnull<QuantizeOp, DecodeOp>(producer))
    return emitOpError() << "quantizes the result of '" << producer->getName().getStringRef()
                         << "': Q, K, V and P are quantized once, from sage.input, sage.smooth or the softmax";
  Origin origin = originOf(getInput());
  if (mlir::failed(verifyDtypeAndGranularity(*this)) || mlir::failed(verifyRoleRules(*this, origin)) ||
      mlir::failed(verifyMicroscaleExtent(*this, origin)))
    return mlir::failure();
  return verifyGroupTokens(*this, origin);
}

mlir::LogicalResult MmaOp::verify() {
  QuantizeOp lhs = dataflow::quantizerOf(getLhs());
  QuantizeOp rhs = dataflow::quantizerOf(getRhs());
  if (!lhs || !rhs)
    return emitOpError() << "operands must come from sage.quantize (use dtype f32/f16 with granularity none for "
                            "an unquantized operand)";
  Origin lhs_origin = originOf(getLhs());
  Origin rhs_origin = originOf(getRhs());
  bool is_qk = lhs_origin == Origin::q && rhs_origin == Origin::k;
  bool is_pv = lhs_origin == Origin::p && rhs_origin == Origin::v;
  if (!is_qk && !is_pv)
    return emitOpError() << "multiplies " << originName(lhs_origin) << " by " << originName(rhs_origin)
                         << "; expected Q by K (scores) or P by V (output)";
  return verifyMmaTypes(*this, dataflow::operandType(getLhs()), dataflow::operandType(getRhs()));
}

mlir::LogicalResult DecodeOp::verify() {
  auto quantize = mlir::dyn_cast_or_null<QuantizeOp>(dataflow::earlierProducer(getInput(), *this));
  if (!quantize)
    return emitOpError() << "decodes quantized codes: its operand must come from sage.quantize";
  const ElementType from = quantize.getDtype();
  const Granularity granularity = quantize.getGranularity();
  ElementType expected = ElementType::f32;
  const char *why = "";
  if (from == ElementType::e2m1 && granularity == Granularity::microscale_1x16) {
    expected = ElementType::f16;
    why = "E2M1 x UE4M3 is exact in f16";
  } else if (from == ElementType::e2m1 && granularity == Granularity::microscale_1x32) {
    expected = ElementType::bf16;
    why = "E2M1 x a power-of-two UE8M0 scale needs f32's exponent range: bf16";
  } else if (from == ElementType::int4) {
    expected = ElementType::int8;
    why = "int4 codes are int8 codes";
  } else {
    return emitOpError() << "only e2m1 and int4 codes are decoded (for targets without their mma), not '"
                         << stringifyElementType(from) << "'";
  }
  if (getDtype() != expected)
    return emitOpError() << "decoding " << stringifyElementType(from) << " with " << stringifyGranularity(granularity)
                         << " scales gives " << stringifyElementType(expected) << " (" << why << "), not '"
                         << stringifyElementType(getDtype()) << "'";
  return mlir::success();
}

mlir::LogicalResult QMeanCorrectionOp::verify() {
  mlir::Operation *scores = dataflow::earlierProducer(getInput(), *this);
  if (!scores || !mlir::isa<DequantOp, MmaOp>(scores) || originOf(getInput()) != Origin::scores)
    return emitOpError() << "corrects the scores S = Q.K^T: its first operand must be the Q.K^T mma or its "
                            "sage.dequant";
  auto smooth = mlir::dyn_cast_or_null<SmoothOp>(dataflow::earlierProducer(getQSmoothed(), *this));
  if (!smooth || originOf(getQSmoothed()) != Origin::q)
    return emitOpError() << "adds mean(Q_i) . K^T: its second operand must be the sage.smooth of Q";
  mlir::Operation *k = dataflow::earlierProducer(getK(), *this);
  if (!k || !mlir::isa<InputOp, SmoothOp>(k) || originOf(getK()) != Origin::k)
    return emitOpError() << "the GEMV multiplies K as it enters its quantizer: its third operand must be the "
                            "sage.input of K or its sage.smooth";
  return mlir::success();
}

mlir::LogicalResult DequantOp::verify() {
  auto mma = getInput().getDefiningOp<MmaOp>();
  if (!mma)
    return emitOpError() << "dequantizes the result of a sage.mma; its operand comes from something else";
  if (!dataflow::operandsCarryScales(mma))
    return emitOpError() << "nothing to dequantize: the operands of the mma carry no scales";
  return mlir::success();
}

mlir::LogicalResult MaskOp::verify() {
  if (mlir::isa_and_nonnull<MaskOp>(dataflow::earlierProducer(getInput(), *this)))
    return emitOpError() << "masks scores a sage.mask already masked: a program has at most one sage.mask";
  if (originOf(getInput()) != Origin::scores)
    return emitOpError() << "masks the scores S = Q.K^T; its operand is " << originName(originOf(getInput()));
  return mlir::success();
}

mlir::LogicalResult OnlineSoftmaxOp::verify() {
  if (getState() != ElementType::f32)
    return emitOpError() << "the running max and sum of the online softmax are kept in f32, got state '"
                         << stringifyElementType(getState()) << "'";
  if (originOf(getInput()) != Origin::scores)
    return emitOpError() << "takes the scores S = Q.K^T; its operand is " << originName(originOf(getInput()));
  MmaOp mma = dataflow::mmaBehind(getInput());
  if (mma && dataflow::operandsCarryScales(mma)) {
    bool dequantized = false;
    mlir::Operation *producer = dataflow::earlierProducer(getInput(), *this);
    for (int steps = 0; producer && steps < dataflow::kMaxWalkSteps; ++steps) {
      if (mlir::isa<DequantOp>(producer)) {
        dequantized = true;
        break;
      }
      if (auto mask = mlir::dyn_cast<MaskOp>(producer))
        producer = dataflow::earlierProducer(mask.getInput(), producer);
      else if (auto correction = mlir::dyn_cast<QMeanCorrectionOp>(producer))
        producer = dataflow::earlierProducer(correction.getInput(), producer);
      else
        break;
    }
    if (!dequantized)
      return emitOpError() << "scores of quantized operands must pass through sage.dequant before the softmax";
  }
  return mlir::success();
}

mlir::LogicalResult AccumulateOp::verify() {
  MmaOp mma = dataflow::mmaBehind(getInput());
  if (!mma || originOf(getInput()) != Origin::output)
    return emitOpError() << "accumulates the P.V product; its operand is " << originName(originOf(getInput()));
  AccumulationKind kind = getKind();
  bool from_f16 = mma.getAccumulator() == AccumulatorType::f16;
  bool two_level = kind == AccumulationKind::f16_then_f32 || kind == AccumulationKind::f32_two_level;
  if ((kind == AccumulationKind::f16 || kind == AccumulationKind::f16_then_f32) && !from_f16)
    return emitOpError() << "an " << stringifyAccumulationKind(kind)
                         << " accumulation needs a P.V mma that accumulates in f16, not '"
                         << stringifyAccumulatorType(mma.getAccumulator()) << "'";
  if ((kind == AccumulationKind::f32 || kind == AccumulationKind::f32_two_level) && from_f16)
    return emitOpError() << "the P.V mma accumulates in f16: use accumulation 'f16' or 'f16_then_f32'";
  if (dataflow::operandsCarryScales(mma) && !getInput().getDefiningOp<DequantOp>())
    return emitOpError() << "P.V of quantized operands must pass through sage.dequant before accumulation";
  const int64_t flush_period = signedValue(getFlushPeriodAttr());
  if (two_level && (flush_period <= 0 || flush_period > kMaxFlushPeriod))
    return emitOpError() << stringifyAccumulationKind(kind) << " needs flush_period in [1, " << kMaxFlushPeriod
                         << "] (KV blocks between flushes into f32), got " << flush_period;
  if (!two_level && flush_period != 0)
    return emitOpError() << "flush_period only applies to the two-level accumulations f16_then_f32 and "
                            "f32_two_level";
  return mlir::success();
}

mlir::LogicalResult NormalizeOp::verify() {
  if (!getInput().getDefiningOp<AccumulateOp>())
    return emitOpError() << "normalizes the accumulated O; its first operand must come from sage.accumulate";
  if (!getSoftmax().getDefiningOp<OnlineSoftmaxOp>())
    return emitOpError() << "divides by the softmax row sum; its second operand must come from sage.online_softmax";
  return mlir::success();
}

mlir::LogicalResult WriteOOp::verify() {
  if (!getInput().getDefiningOp<NormalizeOp>() && !getInput().getDefiningOp<SlaCombineOp>())
    return emitOpError() << "writes the normalized O; its operand must come from sage.normalize (or, in SLA, "
                            "sage.sla_combine)";
  return mlir::success();
}

mlir::LogicalResult WriteLseOp::verify() {
  if (!getSoftmax().getDefiningOp<OnlineSoftmaxOp>())
    return emitOpError() << "writes the LSE of the softmax; its operand must come from sage.online_softmax";
  return mlir::success();
}

} // namespace sage::ir
