// Emits the sage IR of a variant: one op per step of the algorithm, in the paper's order.
#include "EmitSupport.h"
#include "sage/dsl/Attention.h"
#include "sage/ir/Dialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"

#include <stdexcept>
#include <string>

namespace sage::dsl {
namespace {

using detail::toDialect;

class ProgramEmitter : detail::ModuleEmitter {
public:
  using ModuleEmitter::ModuleEmitter;

  void emit(const AttentionVariant &variant) {
    auto attention =
        builder_.create<ir::AttentionOp>(location("attention"), variant.name, variant.version, variant.head_dim,
                                         variant.block_q, variant.block_kv, variant.packed_sequences);
    builder_.createBlock(&attention.getBody());

    mlir::Value q = input(ir::TensorRole::q);
    mlir::Value k = input(ir::TensorRole::k);
    mlir::Value v = input(ir::TensorRole::v);
    // SLA: M_c from the pooled Q.K^T before anything else (Algorithm 1, line 5); the mask below keeps its critical
    // blocks.
    mlir::Value block_classes;
    if (variant.sla.enabled)
      block_classes = builder_.create<ir::PredictMaskOp>(location("predict_mask"), tileType(), q, k,
                                                         builder_.getF64FloatAttr(variant.sla.critical_percent),
                                                         builder_.getF64FloatAttr(variant.sla.negligible_percent));
    const mlir::Value q_input = q, k_input = k, v_input = v;
    q = smooth(q, variant.smooth_q);
    k = smooth(k, variant.smooth_k);
    v = smooth(v, variant.smooth_v);

    // psi_Q(Q), psi_K(K) and S = psi^-1(Q^ . K^^T)
    mlir::Value q_codes = quantize(q, variant.q);
    mlir::Value k_codes = quantize(k, variant.k);
    mlir::Value scores = mma(q_codes, k_codes, variant.qk.accumulator);
    if (variant.q.quantized() || variant.k.quantized())
      scores = builder_.create<ir::DequantOp>(location("dequant_s"), tileType(), scores);
    if (variant.smooth_q != SmoothScope::none) // S += mean(Q_i) . K^T restores the smoothed-away block mean
      scores = builder_.create<ir::QMeanCorrectionOp>(location("q_mean_correction"), tileType(), scores, q, k);
    if (variant.mask.kind != MaskKind::none)
      scores = builder_.create<ir::MaskOp>(location("mask"), tileType(), scores,
                                           toDialect(ir::symbolizeMaskKind, nameOf(variant.mask.kind)));

    // m_i^j, P~_i^j = exp(S - m), l_i^j
    mlir::Value p = builder_.create<ir::OnlineSoftmaxOp>(
        location("online_softmax"), tileType(), scores,
        variant.exp2_softmax ? ir::SoftmaxBase::exp2 : ir::SoftmaxBase::exp, ir::ElementType::f32);

    // O_i^j = diag(exp(m^{j-1} - m^j)) O_i^{j-1} + P~ V
    mlir::Value p_codes = quantize(p, variant.p);
    mlir::Value v_codes = quantize(v, variant.v);
    mlir::Value output = mma(p_codes, v_codes, variant.pv.accumulator);
    if (variant.p.quantized() || variant.v.quantized())
      output = builder_.create<ir::DequantOp>(location("dequant_pv"), tileType(), output);
    output = builder_.create<ir::AccumulateOp>(
        location("accumulate"), tileType(), output,
        toDialect(ir::symbolizeAccumulationKind, nameOf(variant.accumulation.kind)), variant.accumulation.flush_period);

    // Epilogue: O_i = diag(l_i)^-1 O_i, write O (and the LSE)
    mlir::Value normalized = builder_.create<ir::NormalizeOp>(location("normalize"), tileType(), output, p);
    if (variant.sla.enabled) { // O = O^s + Proj(O^l), O^l over the marginal blocks
      mlir::Value linear = builder_.create<ir::LinearBranchOp>(
          location("linear_branch"), tileType(), q_input, k_input, v_input, block_classes,
          toDialect(ir::symbolizeFeatureMap, nameOf(variant.sla.feature_map)));
      normalized = builder_.create<ir::SlaCombineOp>(location("sla_combine"), tileType(), normalized, linear);
    }
    builder_.create<ir::WriteOOp>(location("write_o"), normalized);
    if (variant.epilogue.write_lse)
      builder_.create<ir::WriteLseOp>(location("write_lse"), p, variant.epilogue.lse_smoothing_correction);
  }

private:
  mlir::Value input(ir::TensorRole role) { return builder_.create<ir::InputOp>(location("input"), tileType(), role); }

  mlir::Value smooth(mlir::Value value, SmoothScope scope) {
    if (scope == SmoothScope::none)
      return value;
    return builder_.create<ir::SmoothOp>(location("smooth"), tileType(), value,
                                         toDialect(ir::symbolizeSmoothScope, nameOf(scope)));
  }

  mlir::Value quantize(mlir::Value value, const QuantizerSpec &spec) {
    auto op = builder_.create<ir::QuantizeOp>(
        location("quantize"), tileType(), value, toDialect(ir::symbolizeElementType, nameOf(spec.dtype)),
        toDialect(ir::symbolizeGranularity, nameOf(spec.granularity)), spec.group_tokens,
        toDialect(ir::symbolizeScaleType, nameOf(spec.scale_type)),
        spec.static_scale > 0.0 ? builder_.getF64FloatAttr(spec.static_scale) : mlir::FloatAttr(), spec.two_level,
        spec.fold_softmax_scale,
        spec.rotation_seed ? builder_.getI64IntegerAttr(*spec.rotation_seed) : mlir::IntegerAttr());
    return op.getResult();
  }

  mlir::Value mma(mlir::Value lhs, mlir::Value rhs, AccumulatorType accumulator) {
    return builder_.create<ir::MmaOp>(location("mma"), tileType(), lhs, rhs,
                                      toDialect(ir::symbolizeAccumulatorType, nameOf(accumulator)));
  }
};

} // namespace

ir::Program emitProgram(const AttentionVariant &variant) {
  std::unique_ptr<mlir::MLIRContext> context = ir::Program::makeContext();
  mlir::OpBuilder builder(context.get());
  mlir::ModuleOp module = mlir::ModuleOp::create(builder.getUnknownLoc());
  ProgramEmitter(*context, module).emit(variant);
  return ir::Program::adopt(std::move(context), module);
}

} // namespace sage::dsl
