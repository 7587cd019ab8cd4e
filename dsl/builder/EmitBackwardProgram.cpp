// Emits the sage IR of a backward variant: one op per step of SageAttention3's Algorithm 3, in its order.
#include "EmitSupport.h"
#include "sage/dsl/AttentionBackward.h"
#include "sage/ir/Dialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"

#include <stdexcept>
#include <vector>

namespace sage::dsl {
namespace {

using detail::toDialect;

class BackwardEmitter : detail::ModuleEmitter {
public:
  using ModuleEmitter::ModuleEmitter;

  void emit(const BackwardVariant &variant) {
    auto program =
        builder_.create<ir::AttentionBackwardOp>(location("attention_backward"), variant.name, variant.version,
                                                 variant.head_dim, variant.block_q, variant.block_kv);
    builder_.createBlock(&program.getBody());

    mlir::Value q = input(ir::BackwardRole::q), k = input(ir::BackwardRole::k), v = input(ir::BackwardRole::v);
    mlir::Value o = input(ir::BackwardRole::o), lse = input(ir::BackwardRole::lse);
    mlir::Value d_o = input(ir::BackwardRole::d_o);
    // D = rowsum(dO o O)
    mlir::Value delta = builder_.create<ir::BwdRowDotOp>(location("row_dot"), tileType(), d_o, o);

    // K_s = K - mean(K) (issue 25): S and dQ multiply it
    const bool smoothed = variant.smooth_k != SmoothScope::none;
    if (smoothed)
      k = builder_.create<ir::BwdSmoothOp>(location("smooth"), tileType(), k,
                                           toDialect(ir::symbolizeSmoothScope, nameOf(variant.smooth_k)));
    // S = psi^-1(Q^ K^^T), masked; P = exp(S / sqrt(d) - L), L shifted by q . mean(K) / sqrt(d) when K is smoothed
    mlir::Value scores = mma(variant, BackwardProduct::s, q, k);
    if (variant.mask != MaskKind::none)
      scores = builder_.create<ir::BwdMaskOp>(location("mask"), tileType(), scores,
                                              toDialect(ir::symbolizeMaskKind, nameOf(variant.mask)));
    mlir::Value p = builder_.create<ir::BwdRecomputePOp>(location("recompute_p"), tileType(), scores, lse,
                                                         smoothed ? builder_.getUnitAttr() : mlir::UnitAttr());

    // dV_j += P^T dO; dP = dO V^T; dS = P o (dP - D); dQ_i += dS K; dK_j += dS^T Q
    mlir::Value dv = mma(variant, BackwardProduct::dv, p, d_o);
    mlir::Value dp = mma(variant, BackwardProduct::dp, d_o, v);
    mlir::Value ds = builder_.create<ir::BwdDsOp>(location("ds"), tileType(), p, dp, delta);
    mlir::Value dq = mma(variant, BackwardProduct::dq, ds, k);
    mlir::Value dk = mma(variant, BackwardProduct::dk, ds, q);
    for (mlir::Value gradient : {dq, dk, dv})
      builder_.create<ir::BwdWriteGradOp>(location("write_grad"), gradient, ir::AccumulationKind::f32);
  }

private:
  mlir::Value input(ir::BackwardRole role) {
    return builder_.create<ir::BwdInputOp>(location("input"), tileType(), role);
  }

  // One sage.bwd_quantize per (tensor, quantizer): equal quantizers of one tensor share their codes, except per_token
  // dS, whose scales follow the product (queries for dQ, keys for dK).
  mlir::Value quantize(mlir::Value value, const QuantizerSpec &spec, bool shared = true) {
    for (const Quantized &done : quantized_)
      if (shared && done.source == value && done.spec == spec)
        return done.codes;
    mlir::Value codes = builder_.create<ir::BwdQuantizeOp>(
        location("quantize"), tileType(), value, toDialect(ir::symbolizeElementType, nameOf(spec.dtype)),
        toDialect(ir::symbolizeGranularity, nameOf(spec.granularity)), spec.group_tokens,
        spec.rotation_seed ? builder_.getI64IntegerAttr(*spec.rotation_seed) : mlir::IntegerAttr());
    quantized_.push_back({value, spec, codes});
    return codes;
  }

  mlir::Value mma(const BackwardVariant &variant, BackwardProduct which, mlir::Value lhs, mlir::Value rhs) {
    const BackwardProductSpec &spec = variant.product(which);
    const bool per_token_ds = (which == BackwardProduct::dq || which == BackwardProduct::dk) &&
                              spec.lhs.granularity == Granularity::per_token;
    mlir::Value lhs_codes = quantize(lhs, spec.lhs, !per_token_ds);
    mlir::Value rhs_codes = quantize(rhs, spec.rhs);
    return builder_.create<ir::BwdMmaOp>(location(nameOf(which).data()), tileType(), lhs_codes, rhs_codes,
                                         toDialect(ir::symbolizeAccumulatorType, nameOf(spec.accumulator)));
  }

  struct Quantized {
    mlir::Value source;
    QuantizerSpec spec;
    mlir::Value codes;
  };
  std::vector<Quantized> quantized_;
};

} // namespace

ir::BackwardProgram emitBackwardProgram(const BackwardVariant &variant) {
  std::unique_ptr<mlir::MLIRContext> context = ir::Program::makeContext();
  mlir::OpBuilder builder(context.get());
  mlir::ModuleOp module = mlir::ModuleOp::create(builder.getUnknownLoc());
  BackwardEmitter(*context, module).emit(variant);
  return ir::BackwardProgram::adopt(std::move(context), module);
}

} // namespace sage::dsl
