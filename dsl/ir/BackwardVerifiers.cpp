// Verifiers of the backward program's ops (SageBwd, issue 12) and of the sage.attention_backward program as a whole.
// Each rule names the op, the operand or attribute, and what was expected.
#include "BackwardDataflow.h"
#include "Dataflow.h"
#include "VerifierSupport.h"
#include "sage/ir/AttentionVariant.h"
#include "sage/ir/Dialect.h"
#include "sage/numerics/Hadamard.h"

#include "llvm/ADT/SmallVector.h"

#include <array>
#include <cstdint>
#include <optional>
#include <string>

namespace sage::ir {
namespace {

using backward::Origin;
using backward::originName;
using backward::originOf;
using detail::isCast;
using detail::opsOf;
using detail::signedValue;

// The tile a token group of `origin` must divide: b_q for Q and dO, b_kv for K and V; 0 for P and dS.
int64_t tileTokensOf(mlir::Operation *op, Origin origin) {
  auto program = op->getParentOfType<AttentionBackwardOp>();
  if (!program)
    return 0;
  if (origin == Origin::q || origin == Origin::d_o)
    return signedValue(program.getBlockQAttr());
  if (origin == Origin::k || origin == Origin::v)
    return signedValue(program.getBlockKvAttr());
  return 0;
}

// Operands whose token axis a product sums over: their scale must be constant along it within a tile, so that
// it factors out of the tile's product. The tile-wide scales of P and dS always do.
struct ReductionOperand {
  BackwardProduct product;
  bool lhs;
  const char *axis;
};
constexpr std::array<ReductionOperand, 3> kTokenReductions{{
    {BackwardProduct::dv, false, "the query tokens of a Q tile"},
    {BackwardProduct::dq, false, "the key tokens of a KV tile"},
    {BackwardProduct::dk, false, "the query tokens of a Q tile"},
}};

// The sage.bwd_smooth a quantizer's operand comes from, if any.
BwdSmoothOp smoothOf(BwdQuantizeOp quantize) {
  return quantize ? quantize.getInput().getDefiningOp<BwdSmoothOp>() : BwdSmoothOp();
}

// The randomized Hadamard rotation (issue 25): one rotation per program. S = (Q R_Q)(K R_K)^T needs the same seed on
// both sides, and the kernels quantize Q and K once, so S, dQ and dK share the rotated codes: every quantizer of Q
// and K carries the same rotation_seed, or none does.
mlir::LogicalResult verifyRotation(AttentionBackwardOp program, mlir::Block &body) {
  auto seedText = [](std::optional<int64_t> seed) { return seed ? std::to_string(*seed) : std::string("none"); };
  BwdQuantizeOp first, rotated;
  std::optional<int64_t> first_seed;
  for (BwdQuantizeOp quantize : opsOf<BwdQuantizeOp>(body)) {
    const Origin origin = originOf(quantize.getResult());
    if (origin != Origin::q && origin != Origin::k)
      continue;
    const mlir::IntegerAttr attribute = quantize.getRotationSeedAttr();
    const std::optional<int64_t> seed = attribute ? std::optional<int64_t>(attribute.getInt()) : std::nullopt;
    if (attribute && !rotated)
      rotated = quantize;
    if (!first) {
      first = quantize;
      first_seed = seed;
    } else if (seed != first_seed) {
      return quantize.emitOpError() << "Q and K are rotated with one rotation_seed wherever they meet (S = (Q R)(K "
                                       "R)^T needs the same R on both sides; S, dQ and dK share the rotated codes): "
                                    << originName(origin) << "'s rotation_seed is " << seedText(seed) << ", "
                                    << originName(originOf(first.getResult())) << "'s " << seedText(first_seed);
    }
  }
  const int64_t head_dim = signedValue(program.getHeadDimAttr());
  if (rotated && !numerics::isHadamardDim(head_dim))
    return rotated.emitOpError() << "rotation_seed needs a Sylvester-Hadamard matrix of order head_dim, which exists "
                                    "for powers of two; head_dim must be a power of two in ["
                                 << numerics::kMinHadamardDim << ", " << numerics::kMaxHadamardDim << "], got "
                                 << head_dim;
  return mlir::success();
}

} // namespace

mlir::LogicalResult AttentionBackwardOp::verify() { return detail::verifyProgramAttributes(*this); }

mlir::LogicalResult BwdInputOp::verify() { return mlir::success(); }

mlir::LogicalResult BwdSmoothOp::verify() {
  if (!getInput().getDefiningOp<BwdInputOp>() || originOf(getInput()) != Origin::k)
    return emitOpError() << "smooths K (K - mean(K)): its operand must be 'sage.bwd_input k', got "
                         << originName(originOf(getInput()));
  if (getScope() != SmoothScope::sequence)
    return emitOpError() << "K is smoothed over the whole sequence (one mean per KV head, which the LSE shift "
                            "folds into one term per query row): scope must be 'sequence', got '"
                         << stringifySmoothScope(getScope()) << "'";
  return mlir::success();
}

mlir::LogicalResult BwdRowDotOp::verify() {
  if (!getGradOutput().getDefiningOp<BwdInputOp>() || originOf(getGradOutput()) != Origin::d_o)
    return emitOpError() << "D = rowsum(dO o O): its first operand must be 'sage.bwd_input do', got "
                         << originName(originOf(getGradOutput()));
  if (!getOutput().getDefiningOp<BwdInputOp>() || originOf(getOutput()) != Origin::o)
    return emitOpError() << "D = rowsum(dO o O): its second operand must be 'sage.bwd_input o', got "
                         << originName(originOf(getOutput()));
  return mlir::success();
}

mlir::LogicalResult BwdQuantizeOp::verify() {
  const Origin origin = originOf(getInput());
  const ElementType dtype = getDtype();
  const Granularity granularity = getGranularity();
  const int64_t group = signedValue(getGroupTokensAttr());
  const bool tile_operand = origin == Origin::p || origin == Origin::ds;
  if (!tile_operand && origin != Origin::q && origin != Origin::k && origin != Origin::v && origin != Origin::d_o)
    return emitOpError() << "quantizes " << originName(origin) << "; expected Q, K, V, dO, P or dS";
  if (!tile_operand && !getInput().getDefiningOp<BwdInputOp>() && !getInput().getDefiningOp<BwdSmoothOp>())
    return emitOpError() << "quantizes " << originName(origin) << " as the caller gave it (or K smoothed): its "
                         << "operand must be a sage.bwd_input or a sage.bwd_smooth";
  if (const mlir::IntegerAttr seed = getRotationSeedAttr()) {
    if (origin != Origin::q && origin != Origin::k)
      return emitOpError() << "rotation_seed rotates Q and K along head_dim (their rotations cancel in S = Q.K^T and "
                              "are undone on dQ and dK); "
                           << originName(origin) << " cannot be rotated";
    if (seed.getInt() < 0 || seed.getInt() > int64_t{UINT32_MAX})
      return emitOpError() << "rotation_seed must lie in [0, 2^32 - 1], got " << seed.getInt();
    if (granularity == Granularity::none)
      return emitOpError() << "rotation_seed spreads outlier channels over a quantizer's groups; a cast to "
                           << stringifyElementType(dtype) << " has no scale to protect";
  }
  if (isCast(dtype)) {
    if (granularity != Granularity::none)
      return emitOpError() << "casting to " << stringifyElementType(dtype)
                           << " takes no scale: granularity must be 'none', got '" << stringifyGranularity(granularity)
                           << "'";
  } else if (dtype != ElementType::int8) {
    return emitOpError() << "the backward quantizes to int8 (or casts to f16, bf16, f32), not '"
                         << stringifyElementType(dtype) << "'";
  } else if (tile_operand && granularity != Granularity::per_block && granularity != Granularity::per_token) {
    return emitOpError() << "int8 " << originName(origin) << " takes one scale per b_q x b_kv tile (per_block) or "
                         << "one per token of its product's output (per_token), not '"
                         << stringifyGranularity(granularity) << "'";
  } else if (tile_operand && granularity == Granularity::per_token) {
    // One scale per key of the tile for dV = P^T.dO and dK = dS^T.Q, per query for dQ = dS.K: the axis the product
    // keeps, so that the scales factor out of its sum. One set of codes cannot serve both of dS's products.
    std::optional<BackwardProduct> consumer;
    for (mlir::Operation *user : getResult().getUsers()) {
      auto mma = mlir::dyn_cast<BwdMmaOp>(user);
      const std::optional<BackwardProduct> product = mma ? backward::productOf(mma) : std::nullopt;
      if (!product)
        continue; // the mma's own verifier names what it multiplies
      if (consumer && *consumer != *product)
        return emitOpError() << "per_token " << originName(origin) << " takes one scale per token of its product's "
                             << "output (keys for dK, queries for dQ): the dq and dk products each need their own "
                             << "sage.bwd_quantize";
      consumer = product;
    }
  } else if (!tile_operand && granularity != Granularity::per_token && granularity != Granularity::per_block) {
    return emitOpError() << "int8 " << originName(origin) << " is quantized per_token or per_block, not '"
                         << stringifyGranularity(granularity) << "'";
  }
  if (granularity != Granularity::per_block || tile_operand) {
    if (group != 0)
      return emitOpError() << "group_tokens is only meaningful for per_block Q, K, V and dO (got " << group << ")";
    return mlir::success();
  }
  const int64_t tile = tileTokensOf(*this, origin);
  if (group <= 0 || group > kMaxBlockTokens)
    return emitOpError() << "per_block " << originName(origin) << " needs group_tokens in [1, " << kMaxBlockTokens
                         << "], got " << group;
  if (tile > 0 && tile % group != 0)
    return emitOpError() << "group_tokens " << group << " must divide the " << originName(origin) << " tile of " << tile
                         << " tokens";
  return mlir::success();
}

mlir::LogicalResult BwdMmaOp::verify() {
  auto lhs = getLhs().getDefiningOp<BwdQuantizeOp>();
  auto rhs = getRhs().getDefiningOp<BwdQuantizeOp>();
  if (!lhs || !rhs)
    return emitOpError() << "operands must come from sage.bwd_quantize (cast to f32/f16 for an unquantized one)";
  const std::optional<BackwardProduct> product = backward::productOf(*this);
  if (!product)
    return emitOpError() << "multiplies " << originName(originOf(getLhs())) << " by " << originName(originOf(getRhs()))
                         << "; expected Q by K (S), dO by V (dP), P by dO (dV), dS by K (dQ) or dS by Q (dK)";
  if (lhs.getDtype() != rhs.getDtype())
    return emitOpError() << "operand types " << stringifyElementType(lhs.getDtype()) << " and "
                         << stringifyElementType(rhs.getDtype()) << " cannot be mixed in one mma";
  const AccumulatorType expected = lhs.getDtype() == ElementType::int8 ? AccumulatorType::s32 : AccumulatorType::f32;
  if (getAccumulator() != expected)
    return emitOpError() << "the " << nameOf(*product) << " product of " << stringifyElementType(lhs.getDtype())
                         << " operands accumulates in " << stringifyAccumulatorType(expected) << ", not '"
                         << stringifyAccumulatorType(getAccumulator()) << "'";
  for (const ReductionOperand &reduction : kTokenReductions) {
    if (reduction.product != *product)
      continue;
    BwdQuantizeOp operand = reduction.lhs ? lhs : rhs;
    const Origin origin = originOf(operand.getResult());
    const Granularity granularity = operand.getGranularity();
    const int64_t tile = tileTokensOf(*this, origin);
    const bool constant_over_tile =
        granularity == Granularity::none ||
        (granularity == Granularity::per_block && signedValue(operand.getGroupTokensAttr()) == tile);
    if (!constant_over_tile)
      return emitOpError() << "the " << nameOf(*product) << " product sums over " << reduction.axis << ": "
                           << originName(origin) << "'s scale must be one per tile (per_block with group_tokens "
                           << tile << ") or absent, got '" << stringifyGranularity(granularity) << "'";
  }
  return mlir::success();
}

mlir::LogicalResult BwdMaskOp::verify() {
  if (originOf(getInput()) != Origin::s || !getInput().getDefiningOp<BwdMmaOp>())
    return emitOpError() << "masks the recomputed scores: its operand must be the Q.K^T sage.bwd_mma, got "
                         << originName(originOf(getInput()));
  if (getKind() == MaskKind::block_sparse)
    return emitOpError() << "the backward supports masks 'none' and 'causal', not 'block_sparse'";
  return mlir::success();
}

mlir::LogicalResult BwdRecomputePOp::verify() {
  mlir::Operation *scores = dataflow::earlierProducer(getScores(), *this);
  if (!scores || !mlir::isa<BwdMmaOp, BwdMaskOp>(scores) || originOf(getScores()) != Origin::s)
    return emitOpError() << "recomputes P from the scores: its first operand must be the Q.K^T sage.bwd_mma or its "
                            "sage.bwd_mask, got "
                         << originName(originOf(getScores()));
  if (!getLse().getDefiningOp<BwdInputOp>() || originOf(getLse()) != Origin::lse)
    return emitOpError() << "its second operand must be 'sage.bwd_input lse', got " << originName(originOf(getLse()));
  auto product = mlir::isa<BwdMaskOp>(scores) ? mlir::cast<BwdMaskOp>(scores).getInput().getDefiningOp<BwdMmaOp>()
                                              : mlir::cast<BwdMmaOp>(scores);
  const bool smoothed = product && smoothOf(product.getRhs().getDefiningOp<BwdQuantizeOp>());
  if (smoothed && !getSmoothingShift())
    return emitOpError() << "S is recomputed from the smoothed K, the LSE is the forward's of the unsmoothed scores: "
                            "P needs the LSE shifted by q . mean(K) / sqrt(d) ({smoothing_shift})";
  if (!smoothed && getSmoothingShift())
    return emitOpError() << "{smoothing_shift} shifts the LSE by q . mean(K) / sqrt(d), but S is recomputed from K "
                            "unsmoothed (no sage.bwd_smooth)";
  return mlir::success();
}

mlir::LogicalResult BwdDsOp::verify() {
  if (!getP().getDefiningOp<BwdRecomputePOp>())
    return emitOpError() << "dS = P o (dP - D) takes the unquantized P: its first operand must be the "
                            "sage.bwd_recompute_p, got "
                         << originName(originOf(getP()));
  if (!getDp().getDefiningOp<BwdMmaOp>() || originOf(getDp()) != Origin::dp)
    return emitOpError() << "its second operand must be the dO.V^T sage.bwd_mma, got " << originName(originOf(getDp()));
  if (!getDelta().getDefiningOp<BwdRowDotOp>())
    return emitOpError() << "its third operand must be the sage.bwd_row_dot D, got "
                         << originName(originOf(getDelta()));
  return mlir::success();
}

mlir::LogicalResult BwdWriteGradOp::verify() {
  const Origin origin = originOf(getInput());
  if (!getInput().getDefiningOp<BwdMmaOp>() || (origin != Origin::dq && origin != Origin::dk && origin != Origin::dv))
    return emitOpError() << "writes a gradient: its operand must be the dQ, dK or dV sage.bwd_mma, got "
                         << originName(origin);
  if (getAccumulation() != AccumulationKind::f32)
    return emitOpError() << "gradients accumulate over tiles in f32, not '"
                         << stringifyAccumulationKind(getAccumulation()) << "'";
  return mlir::success();
}

// The whole program: every input once, each product once, D, P, dS once, each gradient written once.
mlir::LogicalResult AttentionBackwardOp::verifyRegions() {
  mlir::Block &body = getBody().front();
  for (mlir::Operation &op : body)
    if (op.getDialect() != (*this)->getDialect())
      return op.emitOpError() << "is not a sage op; a sage.attention_backward body holds only sage ops";

  auto inputs = opsOf<BwdInputOp>(body);
  for (BackwardRole role :
       {BackwardRole::q, BackwardRole::k, BackwardRole::v, BackwardRole::o, BackwardRole::lse, BackwardRole::d_o}) {
    int count = 0;
    for (BwdInputOp input : inputs)
      count += input.getRole() == role ? 1 : 0;
    if (count != 1)
      return emitOpError() << "expects exactly one 'sage.bwd_input " << stringifyBackwardRole(role) << "', found "
                           << count;
  }

  std::array<int, 5> product_counts{};
  for (BwdMmaOp mma : opsOf<BwdMmaOp>(body))
    if (std::optional<BackwardProduct> product = backward::productOf(mma))
      ++product_counts[static_cast<size_t>(*product)];
  for (BackwardProduct product : kBackwardProducts)
    if (product_counts[static_cast<size_t>(product)] != 1)
      return emitOpError() << "expects exactly one " << nameOf(product) << " product (sage.bwd_mma), found "
                           << product_counts[static_cast<size_t>(product)];

  // K smoothed: S and dQ multiply the same smoothed K (dQ = dS (K - mean(K)) = dS K as dS's rows sum to zero).
  const auto smooths = opsOf<BwdSmoothOp>(body);
  if (smooths.size() > 1)
    return emitOpError() << "expects at most one sage.bwd_smooth (of K), found " << smooths.size();
  if (!smooths.empty())
    for (BwdQuantizeOp quantize : opsOf<BwdQuantizeOp>(body))
      if (originOf(quantize.getResult()) == Origin::k && !smoothOf(quantize))
        return quantize.emitOpError() << "quantizes K unsmoothed, but K is smoothed (sage.bwd_smooth): S and dQ "
                                         "= dS.K both take the smoothed K";

  if (mlir::LogicalResult rotation = verifyRotation(*this, body); mlir::failed(rotation))
    return rotation;

  if (opsOf<BwdMaskOp>(body).size() > 1)
    return emitOpError() << "expects at most one sage.bwd_mask";
  if (opsOf<BwdRecomputePOp>(body).size() != 1)
    return emitOpError() << "expects exactly one sage.bwd_recompute_p";
  if (opsOf<BwdRowDotOp>(body).size() != 1)
    return emitOpError() << "expects exactly one sage.bwd_row_dot (D = rowsum(dO o O))";
  if (opsOf<BwdDsOp>(body).size() != 1)
    return emitOpError() << "expects exactly one sage.bwd_ds";

  std::array<int, 3> writes{}; // dq, dk, dv
  for (BwdWriteGradOp write : opsOf<BwdWriteGradOp>(body)) {
    const Origin origin = originOf(write.getInput());
    ++writes[origin == Origin::dq ? 0 : origin == Origin::dk ? 1 : 2];
  }
  const char *names[] = {"dQ", "dK", "dV"};
  for (int g = 0; g < 3; ++g)
    if (writes[g] != 1)
      return emitOpError() << "expects exactly one sage.bwd_write_grad of " << names[g] << ", found " << writes[g];
  return mlir::success();
}

} // namespace sage::ir
