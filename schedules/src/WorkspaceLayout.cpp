// Sizes and offsets of the prologue's workspace (see WorkspaceLayout.h for the buffers' meaning).
//
// Buffers are laid out in this order, each at a 256-byte aligned offset:
//   q_codes, k_codes, v_codes, q_scales, k_scales, v_scales, k_mean, q_mean, v_mean, v_values,
//   prologue_statistics.
// Only what the prologue writes for the variant and the input type is reserved: v_values only for an f16 P.V on
// a bf16 input or a smoothed V (an f16, unsmoothed V is read in place).
#include "sage/schedules/WorkspaceLayout.h"

#include "sage/ir/AttentionVariant.h"
#include "sage/numerics/CheckedSize.h"

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>

namespace sage::schedules {
namespace {

constexpr size_t kBufferAlignment = 256;

void require(bool condition, const std::string &message) {
  if (!condition)
    throw std::invalid_argument(message);
}

std::string granularityName(Granularity granularity) { return std::string(nameOf(granularity)); }

std::string dtypeName(ElementType type) { return std::string(nameOf(type)); }

// int4 codes are stored one per byte, as int8 values in [-7, 7]: the legalized (s4 -> s8) operand.
bool isByteCode(ElementType type) {
  return type == ElementType::int8 || type == ElementType::int4 || type == ElementType::e4m3 ||
         type == ElementType::e5m2;
}

// The most tokens a shape may have: far beyond any GPU's memory, and small enough that no padding overflows.
constexpr int64_t kMaxShapeTokens = int64_t(1) << 31;

int64_t roundUp(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// Tokens sharing one scale for the grouped granularities; 0 in the spec means the whole tile.
int64_t groupTokens(const QuantizerSpec &spec, int64_t block_tokens) {
  const int64_t group = spec.group_tokens > 0 ? spec.group_tokens : block_tokens;
  require(block_tokens % group == 0, "group_tokens " + std::to_string(group) + " of a " +
                                         granularityName(spec.granularity) + " quantizer must divide the " +
                                         std::to_string(block_tokens) + "-token tile");
  if (spec.granularity == Granularity::per_thread)
    require(group % 8 == 0,
            "per_thread interleaves tokens by 8: group_tokens must be a multiple of 8, got " + std::to_string(group));
  return group;
}

void requireTokenGranularity(const QuantizerSpec &spec, const char *function) {
  const Granularity granularity = spec.granularity;
  require(granularity != Granularity::per_channel && granularity != Granularity::microscale_1x16,
          std::string(function) + ": granularity '" + granularityName(granularity) +
              "' does not group tokens (expected none, per_tensor, per_token, per_block, per_warp or per_thread)");
}

// Quantized Q, K and V are stored one code per byte.
void requireByteCodes(const QuantizerSpec &spec, const char *operand) {
  require(isByteCode(spec.dtype), std::string(operand) +
                                      ": the workspace holds 8-bit codes (int8, int4 one per byte, e4m3, e5m2), got " +
                                      dtypeName(spec.dtype));
}

bool isFloatCast(const QuantizerSpec &spec) {
  return spec.static_scale <= 0.0 &&
         (spec.dtype == ElementType::f16 || spec.dtype == ElementType::bf16 || spec.dtype == ElementType::f32);
}

// An unquantized Q or K is a cast: copied in the input type (2 bytes per element).
void requireTokenOperand(const QuantizerSpec &spec, const char *operand) {
  requireTokenGranularity(spec, operand);
  if (spec.granularity != Granularity::none)
    requireByteCodes(spec, operand);
  else
    require(isFloatCast(spec), std::string(operand) +
                                   ": granularity none is a cast, stored in the input type: expected dtype f16, "
                                   "bf16 or f32 without a static scale, got " +
                                   dtypeName(spec.dtype));
}

void validateShape(const AttentionVariant &variant, const ProblemShape &shape) {
  require(shape.batch > 0, "shape.batch must be positive, got " + std::to_string(shape.batch));
  require(shape.heads_q > 0, "shape.heads_q must be positive, got " + std::to_string(shape.heads_q));
  require(shape.heads_kv > 0 && shape.heads_q % shape.heads_kv == 0,
          "shape.heads_kv must be positive and divide heads_q (" + std::to_string(shape.heads_q) + "), got " +
              std::to_string(shape.heads_kv));
  require(shape.tokens_q > 0 && shape.tokens_q <= kMaxShapeTokens,
          "shape.tokens_q must be in [1, 2^31], got " + std::to_string(shape.tokens_q));
  require(shape.tokens_kv > 0 && shape.tokens_kv <= kMaxShapeTokens,
          "shape.tokens_kv must be in [1, 2^31], got " + std::to_string(shape.tokens_kv));
  require(shape.head_dim == variant.head_dim, "shape.head_dim " + std::to_string(shape.head_dim) +
                                                  " does not match the variant's head_dim " +
                                                  std::to_string(variant.head_dim));
  require(variant.block_q > 0 && variant.block_kv > 0, "variant: block_q and block_kv must be positive, got " +
                                                           std::to_string(variant.block_q) + " and " +
                                                           std::to_string(variant.block_kv));
}

// Appends buffers at aligned offsets; a total past 2^62 bytes is an error, not a wrapped size.
class Allocator {
public:
  BufferSlice take(size_t bytes) {
    const size_t rounded = (bytes + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
    require(bytes <= kMaxWorkspaceBytes && end_ + rounded <= kMaxWorkspaceBytes,
            "shape: the workspace would exceed 2^62 bytes (batch x heads x tokens x head_dim is too large)");
    BufferSlice slice{end_, bytes};
    end_ += rounded;
    return slice;
  }
  size_t end() const { return end_; }

private:
  static constexpr size_t kMaxWorkspaceBytes = size_t(1) << 62;
  size_t end_ = 0;
};

// Products of the caller's sizes, checked in 64 bits: a huge shape is an error, never a wrapped size.
int64_t count(std::initializer_list<int64_t> factors) {
  const std::optional<int64_t> product = numerics::checkedProduct(factors);
  require(product.has_value(),
          "shape: the workspace size overflows 64 bits (batch x heads x tokens x head_dim is too large)");
  return *product;
}

size_t bytes(std::initializer_list<int64_t> factors, size_t element_bytes) {
  return static_cast<size_t>(count({count(factors), static_cast<int64_t>(element_bytes)}));
}

} // namespace

int64_t groupsPerBlock(const QuantizerSpec &spec, int64_t block_tokens) {
  require(block_tokens > 0, "groupsPerBlock: block_tokens must be positive, got " + std::to_string(block_tokens));
  requireTokenGranularity(spec, "groupsPerBlock");
  switch (spec.granularity) {
  case Granularity::none:
    return 0;
  case Granularity::per_tensor:
    return 1;
  case Granularity::per_token:
    return block_tokens;
  case Granularity::per_block:
  case Granularity::per_warp:
    return block_tokens / groupTokens(spec, block_tokens);
  case Granularity::per_thread:
    return block_tokens / groupTokens(spec, block_tokens) * 8;
  default:
    return 0; // rejected above
  }
}

int64_t scaleGroupOfToken(const QuantizerSpec &spec, int64_t block_tokens, int64_t token) {
  require(block_tokens > 0, "scaleGroupOfToken: block_tokens must be positive, got " + std::to_string(block_tokens));
  require(token >= 0, "scaleGroupOfToken: token must be >= 0, got " + std::to_string(token));
  requireTokenGranularity(spec, "scaleGroupOfToken");
  switch (spec.granularity) {
  case Granularity::none:
    throw std::invalid_argument("scaleGroupOfToken: granularity 'none' has no scales");
  case Granularity::per_tensor:
    return 0;
  case Granularity::per_token:
    return token;
  case Granularity::per_block:
  case Granularity::per_warp:
    return token / groupTokens(spec, block_tokens);
  case Granularity::per_thread: {
    // The rows an mma thread group owns: tokens t, t + 8, t + 16, ... of one group share a scale.
    const int64_t group = groupTokens(spec, block_tokens);
    return token / group * 8 + token % 8;
  }
  default:
    return 0; // rejected above
  }
}

int64_t vCodesTokenAt(VCodesTokenOrder order, int64_t position) {
  require(position >= 0, "vCodesTokenAt: position must be >= 0, got " + std::to_string(position));
  if (order == VCodesTokenOrder::natural)
    return position;
  const int64_t p = position % 32;
  return position - p + 16 * (p / 16) + 8 * (p % 4 / 2) + 2 * (p % 16 / 4) + p % 2;
}

int64_t workspaceOperandBytes(const QuantizerSpec &spec) { return spec.granularity == Granularity::none ? 2 : 1; }

static bool isFp4Operand(const QuantizerSpec &spec) {
  return spec.dtype == ElementType::e2m1 && isMicroscale(spec.granularity);
}

WorkspaceLayout computeWorkspaceLayout(const AttentionVariant &variant, const ProblemShape &shape, InputType input) {
  validateShape(variant, shape);
  // FP4 (issue 11): e2m1 codes two per byte, one scale byte per 16 (NVFP4) or 32 (MXFP4) elements along the
  // reduction axis: channels of Q and K, tokens of V.
  const bool fp4_q = isFp4Operand(variant.q), fp4_k = isFp4Operand(variant.k), fp4_v = isFp4Operand(variant.v);
  for (const auto &[fp4, spec, name] :
       {std::tuple{fp4_q, &variant.q, "q quantizer"}, std::tuple{fp4_k, &variant.k, "k quantizer"}}) {
    if (!fp4)
      requireTokenOperand(*spec, name);
    else
      require(shape.head_dim % microscaleGroupSize(spec->granularity) == 0,
              std::string(name) + ": head_dim " + std::to_string(shape.head_dim) + " is not a multiple of its " +
                  std::to_string(microscaleGroupSize(spec->granularity)) + "-channel microscale groups");
  }
  if (fp4_v)
    require(variant.block_kv % microscaleGroupSize(variant.v.granularity) == 0,
            "v quantizer: block_kv " + std::to_string(variant.block_kv) + " is not a multiple of its " +
                std::to_string(microscaleGroupSize(variant.v.granularity)) + "-token microscale groups");
  const bool v_per_channel = variant.v.granularity == Granularity::per_channel;
  const bool v_quantized = v_per_channel || fp4_v;
  if (v_per_channel)
    requireByteCodes(variant.v, "v quantizer");
  else if (!fp4_v)
    require(variant.v.granularity == Granularity::none &&
                (variant.v.dtype == ElementType::f16 || variant.v.dtype == ElementType::f32),
            "v quantizer: expected per_channel codes, FP4 (e2m1 microscaled) codes or an f16/f32 cast (an f16 P.V), "
            "got " +
                dtypeName(variant.v.dtype) + " '" + granularityName(variant.v.granularity) + "'");
  // An unquantized V (f16, or f32 rounded to f16 on the GPU) feeds an f16 P.V: the prologue writes an f16 copy
  // only when the caller's V is not f16 already or is smoothed.
  const bool v_copy = !v_quantized && (input == InputType::bf16 || variant.smooth_v == SmoothScope::sequence);

  WorkspaceLayout layout;
  layout.padded_q = roundUp(shape.tokens_q, variant.block_q);
  layout.padded_kv = roundUp(shape.tokens_kv, variant.block_kv);
  const int64_t q_blocks = layout.padded_q / variant.block_q;
  const int64_t kv_blocks = layout.padded_kv / variant.block_kv;
  const auto scaleCount = [](const QuantizerSpec &spec, int64_t blocks, int64_t block_tokens) -> int64_t {
    if (spec.granularity == Granularity::per_tensor)
      return 1;
    return count({blocks, groupsPerBlock(spec, block_tokens)});
  };
  const int64_t d = shape.head_dim;
  // FP4: one scale byte per group of channels of every (padded) token.
  layout.q_scale_count = fp4_q ? count({layout.padded_q, d / microscaleGroupSize(variant.q.granularity)})
                               : scaleCount(variant.q, q_blocks, variant.block_q);
  layout.k_scale_count = fp4_k ? count({layout.padded_kv, d / microscaleGroupSize(variant.k.granularity)})
                               : scaleCount(variant.k, kv_blocks, variant.block_kv);

  const int64_t q_heads = count({shape.batch, shape.heads_q});
  const int64_t kv_heads = count({shape.batch, shape.heads_kv});

  Allocator allocator;
  layout.q_codes = allocator.take(fp4_q ? bytes({q_heads, layout.padded_q, d / 2}, 1)
                                        : bytes({q_heads, layout.padded_q, d}, workspaceOperandBytes(variant.q)));
  layout.k_codes = allocator.take(fp4_k ? bytes({kv_heads, layout.padded_kv, d / 2}, 1)
                                        : bytes({kv_heads, layout.padded_kv, d}, workspaceOperandBytes(variant.k)));
  layout.v_codes = allocator.take(fp4_v           ? bytes({kv_heads, d, layout.padded_kv / 2}, 1)
                                  : v_per_channel ? bytes({kv_heads, d, layout.padded_kv}, 1)
                                                  : 0);
  layout.q_scales = allocator.take(bytes({q_heads, layout.q_scale_count}, fp4_q ? 1 : sizeof(float)));
  layout.k_scales = allocator.take(bytes({kv_heads, layout.k_scale_count}, fp4_k ? 1 : sizeof(float)));
  layout.v_scales =
      allocator.take(fp4_v ? bytes({kv_heads, d, layout.padded_kv / microscaleGroupSize(variant.v.granularity)}, 1)
                     : v_per_channel ? bytes({kv_heads, d}, sizeof(float))
                                     : 0);
  layout.k_mean = allocator.take(variant.smooth_k == SmoothScope::sequence ? bytes({kv_heads, d}, sizeof(float)) : 0);
  layout.q_mean =
      allocator.take(variant.smooth_q == SmoothScope::block ? bytes({q_heads, q_blocks, d}, sizeof(float)) : 0);
  layout.v_mean = allocator.take(variant.smooth_v == SmoothScope::sequence ? bytes({kv_heads, d}, sizeof(float)) : 0);
  layout.delta_s = allocator.take(
      variant.smooth_q == SmoothScope::block ? bytes({q_heads, q_blocks, layout.padded_kv}, sizeof(float)) : 0);
  layout.v_values = allocator.take(v_copy ? bytes({kv_heads, layout.padded_kv, d}, sizeof(uint16_t)) : 0);
  // Per channel and slice: a K sum (mean(K)), a V sum (mean(V)), K's min and max (per-tensor psi_K, 2 bytes
  // each) and V's (per-channel psi_V); per-tensor psi_Q adds one amax per Q block.
  const bool k_per_tensor = variant.k.granularity == Granularity::per_tensor;
  const int64_t column_bytes = (variant.smooth_k == SmoothScope::sequence ? 4 : 0) +
                               (variant.smooth_v == SmoothScope::sequence ? 4 : 0) + (k_per_tensor ? 4 : 0) +
                               (v_per_channel ? 4 : 0);
  const int64_t slices = std::min<int64_t>(kMaxPrologueStatisticsSlices, (shape.tokens_kv + 15) / 16);
  const size_t q_amax_bytes = variant.q.granularity == Granularity::per_tensor ? bytes({q_heads, q_blocks}, 4) : 0;
  // One slice more: the one-pass prologue's statistics of each head, combined once, take at most a slice's room.
  layout.prologue_statistics =
      allocator.take(q_amax_bytes + (column_bytes > 0 ? bytes({kv_heads, slices + 1, d}, column_bytes) : 0));
  // The one-pass prologue's counters: a ticket, then per KV head the statistics CTAs that have published.
  layout.prologue_counters = allocator.take(column_bytes > 0 ? bytes({kv_heads + 1}, sizeof(uint32_t)) : 0);
  // Every variant has one: whether its kernel is persistent depends on the schedule, which the layout does not know.
  layout.attention_counters = allocator.take(sizeof(uint32_t));
  layout.total_bytes = allocator.end();
  return layout;
}

} // namespace sage::schedules
