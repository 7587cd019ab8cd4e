// The generated kernel's helpers: the PTX wrappers it uses, shared-memory tile addressing and copies, lane
// reductions, scale groups and the map from S's columns to KV tokens.
#include "KernelText.h"

#include "sage/codegen/PtxEmitters.h"

#include <string>

namespace sage::codegen::detail {
namespace {

using schedules::PvPath;
using schedules::ValueSource;

constexpr std::string_view kTileHelpers =
    R"(// The CTA's dynamic shared memory: Q_i, then the pipeline stages (offsets above)
extern __shared__ __align__(128) unsigned char shared_memory[];

__device__ __forceinline__ float negative_infinity() { return __int_as_float(0xff800000u); }

// ---- Shared-memory tiles ----
// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of kRowChunks chunks per row. The chunk index is
// XORed with the row's position among the rows that share a 128-byte bank line, so the 8 rows one ldmatrix phase
// reads, and the 8 chunks one cp.async phase writes, land in 8 different groups of 4 banks: no bank conflicts.
template <int kRowChunks> __device__ __forceinline__ unsigned swizzled_offset(int row, int chunk) {
  constexpr int kRowsPerBankLine = kRowChunks >= kBankLineChunks ? 1 : kBankLineChunks / kRowChunks;
  constexpr int kSwizzlePattern = kRowChunks >= kBankLineChunks ? kBankLineChunks : kRowChunks;
  return (row * kRowChunks + (chunk ^ ((row / kRowsPerBankLine) % kSwizzlePattern))) * kChunkBytes;
}

// The address of (lane row + a whole number of 8-row groups, lane chunk + a chunk step whose bits are disjoint
// from the lane's): adding 8-row groups keeps a row's swizzle, and such a chunk step commutes with the XOR. So
// each lane computes swizzled_offset once, and every ldmatrix of a loop only adds/XORs compile-time constants.
__device__ __forceinline__ unsigned tile_address(unsigned tile, unsigned lane_offset, int row_step_bytes,
                                                 int chunk_step) {
  return tile + (lane_offset ^ static_cast<unsigned>(chunk_step * kChunkBytes)) + row_step_bytes;
}

// Copies a kRows x kRowBytes tile (global rows `row_stride` bytes apart) into a swizzled shared tile with
// cp.async: thread t copies chunk t % kRowChunks of rows t / kRowChunks + pass * kRowsPerPass. With
// kZeroFillTail, rows at or past `valid_rows` (past the end of the sequence) are zero-filled instead of read.
template <int kRows, int kRowBytes, bool kZeroFillTail>
__device__ __forceinline__ void copy_tile_async(unsigned shared_tile, const unsigned char *global_tile,
                                                long long row_stride, int valid_rows) {
  constexpr int kRowChunks = kRowBytes / kChunkBytes;
  constexpr int kRowsPerPass = kThreads / kRowChunks;
  static_assert(kRowsPerPass % kLdmatrixRows == 0, "each pass must advance by whole 8-row swizzle groups");
  const int row = static_cast<int>(threadIdx.x) / kRowChunks, chunk = static_cast<int>(threadIdx.x) % kRowChunks;
  const unsigned shared_chunk = shared_tile + swizzled_offset<kRowChunks>(row, chunk);
  const unsigned char *source = global_tile + row * row_stride + chunk * kChunkBytes;
#pragma unroll
  for (int pass = 0; pass < (kRows + kRowsPerPass - 1) / kRowsPerPass; ++pass) {
    if (kRows % kRowsPerPass == 0 || row + pass * kRowsPerPass < kRows) {
      const bool fill = !kZeroFillTail || row + pass * kRowsPerPass < valid_rows;
      cp_async_16(shared_chunk + pass * kRowsPerPass * kRowBytes,
                  fill ? source + pass * kRowsPerPass * row_stride : global_tile, fill);
    }
  }
}

// A compile-time flag passed to the main loop's generic lambda: Masked<true>{} selects the masked step.
template <bool kValue> struct Masked {
  static constexpr bool value = kValue;
};

// ---- Reductions over the kLanesPerRow lanes that hold one accumulator row ----
__device__ __forceinline__ float quad_max(float value) {
  value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 1));
  return fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 2));
}

__device__ __forceinline__ float quad_sum(float value) {
  value += __shfl_xor_sync(0xffffffffu, value, 1);
  return value + __shfl_xor_sync(0xffffffffu, value, 2);
}

)";

constexpr std::string_view kScaleGroup =
    R"(// Index of the scale of `token` (0-based in the sequence) for a quantizer with these groups
template <int kTokensPerGroup, int kInterleave> __device__ __forceinline__ int scale_group(int token) {
  if constexpr (kTokensPerGroup == 0)
    return 0;
  else
    return token / kTokensPerGroup * kInterleave + token % kInterleave;
}

)";

constexpr std::string_view kPlainColumns =
    R"(// Column `column` of n8 tile `tile` of S_i^j is KV token tile * 8 + column of the block
__device__ __forceinline__ int kv_token_of_column(int tile, int column) { return tile * kMmaColumns + column; }

)";

constexpr std::string_view kInterleavedColumns =
    R"(// 8-bit P.V reads P~ as the A operand of m16n8k32, where a thread needs 4 consecutive tokens per register; an S
// accumulator gives it only 2 consecutive columns per n8 tile. So the K rows feeding S are permuted: within each
// group of 4 tiles (32 tokens), column 2c + b of tile 2h + s holds token 16h + 4c + 2s + b. Then tiles 2h and 2h + 1
// of a thread pack into the A register for tokens 16h + 4c .. 16h + 4c + 3 with no data movement.
__device__ __forceinline__ int kv_token_of_column(int tile, int column) {
  constexpr int kTilesPerStep = kPvStepTokens / kMmaColumns;
  const int step = tile / kTilesPerStep, tile_in_step = tile % kTilesPerStep;
  const int step_half = tile_in_step / 2, tile_in_half = tile_in_step % 2;
  return step * kPvStepTokens + step_half * (kPvStepTokens / 2) + (column / 2) * 4 + tile_in_half * 2 + column % 2;
}

)";

} // namespace

std::string emitInstructionWrappers(const KernelContext &context) {
  const schedules::KernelPlan &plan = context.plan;
  std::string text = "// ---- PTX instruction wrappers ----\n";
  text += emitMmaFunction(plan.qk_mma);
  if (!(plan.pv_mma == plan.qk_mma))
    text += emitMmaFunction(plan.pv_mma);
  text += emitLdmatrixFunction(4, false);
  if (plan.v_source != ValueSource::workspace_codes)
    text += emitLdmatrixFunction(4, true);
  else if (!context.fp4) // V^T's last k step when b_kv / 32 is odd (FP4: the decoded V^T has an even number of steps)
    text += emitLdmatrixFunction(2, false);
  text += emitCpAsyncCopy16Function();
  if (context.staged_k_scales)
    text += emitCpAsyncCopy4Function();
  text += emitCpAsyncCommitFunction();
  text += emitCpAsyncWaitFunction();
  text += emitExp2Function();
  if (context.variant.epilogue.write_lse)
    text += emitLog2Function();
  text += emitPackF16x2Function(); // P~ in f16, O in f16, the rescale factor of an f16 accumulator
  if (plan.input == schedules::InputType::bf16 || plan.pv_mma.a == ElementType::bf16) // output; or MXFP4's decode
    text += emitPackBf16x2Function();
  if (plan.pv_path == PvPath::f16_accumulate_f16) {
    text += emitScaleF16x2Function();
    text += emitUnpackF16x2Function();
  }
  if (plan.pv_path == PvPath::int8_per_block)
    text += emitPackS8x4Function();
  if (plan.pv_path == PvPath::e4m3_accumulate_f32)
    text += emitPackE4m3x4Function();
  return text + "\n";
}

std::string emitTileHelpers(const KernelContext &context) {
  std::string text(kTileHelpers);
  if (context.quantized_qk)
    text += kScaleGroup;
  text += context.plan.interleave_kv_tokens ? kInterleavedColumns : kPlainColumns;
  return text;
}

} // namespace sage::codegen::detail
