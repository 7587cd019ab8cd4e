// Which lane holds which element of the sm120 FP4 kernel's fragments, and the permutation of S's columns that makes
// the Q.K^T accumulator the A operand of P.V. Plain integer functions, compiled by NVRTC for the kernel and by the
// host compiler for the tests (tests/codegen/Sm120FragmentsTest.cpp), so both read one definition.
//
// m16n8k64 block-scaled mma.sync with e2m1 operands (PTX ISA, "Matrix fragments for mma.m16n8k64"), lane = 4g + q:
//   A (4 x .b32, 8 nibbles each)  register r, nibble e: row g + 8 (r % 2), k = 32 (r / 2) + 8q + e
//   B (2 x .b32)                  register r, nibble e: column g, k = 32 r + 8q + e
//   C/D (4 x f32)                 element e: row g + 8 (e / 2), column 2q + e % 2
//   scale A (.b32)                row g + 8 (lane % 2) (lanes q and q ^ 2 hold the same), byte s: k group s
//   scale B (.b32)                column g, byte s: k group s (16 elements per group with scale_vec::4X, 32 with 2X)
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define SAGE_SM120_FRAGMENT_FUNCTION __host__ __device__ __forceinline__ constexpr
#else
#define SAGE_SM120_FRAGMENT_FUNCTION inline constexpr
#endif

namespace sage::device::sm120 {

// Within every 32 columns of S, column 8j + 2q + r (j: the n8 tile, q: the lane's place in its quad, r: which of
// its two accumulator columns) holds KV token 8q + 2j + r. The kernel reads K's row score_column_token(n) for
// column n (SageAttention3, section 3.3: the permutation is applied to K, here by its shared-memory addressing), so
// lane q's accumulators of tiles j = 0..3 hold tokens 8q + 0..7: exactly A register 0/1's k, and tiles 4..7 those
// of registers 2/3. The map swaps j and q, so it is its own inverse.
SAGE_SM120_FRAGMENT_FUNCTION int score_column_token(int column) {
  return column - column % 32 + 8 * ((column % 8) / 2) + 2 * ((column % 32) / 8) + column % 2;
}

SAGE_SM120_FRAGMENT_FUNCTION int accumulator_row(int lane, int element) { return lane / 4 + 8 * (element / 2); }
SAGE_SM120_FRAGMENT_FUNCTION int accumulator_column(int lane, int element) { return 2 * (lane % 4) + element % 2; }

SAGE_SM120_FRAGMENT_FUNCTION int a_row(int lane, int reg) { return lane / 4 + 8 * (reg % 2); }
SAGE_SM120_FRAGMENT_FUNCTION int a_k(int lane, int reg, int nibble) { return 32 * (reg / 2) + 8 * (lane % 4) + nibble; }
SAGE_SM120_FRAGMENT_FUNCTION int b_column(int lane) { return lane / 4; }
SAGE_SM120_FRAGMENT_FUNCTION int b_k(int lane, int reg, int nibble) { return 32 * reg + 8 * (lane % 4) + nibble; }
SAGE_SM120_FRAGMENT_FUNCTION int scale_a_row(int lane) { return lane / 4 + 8 * (lane % 2); }

// P~ of one 64-column chunk of S as the A operand: the accumulator of n8 tile `tile` (0..7 within the chunk),
// element `element` (0..3) goes to A register p_register, nibble p_nibble.
SAGE_SM120_FRAGMENT_FUNCTION int p_register(int tile, int element) { return 2 * (tile / 4) + element / 2; }
SAGE_SM120_FRAGMENT_FUNCTION int p_nibble(int tile, int element) { return 2 * (tile % 4) + element % 2; }

// NVFP4 P: the microscale of 16-token group `group` (0..3) of a chunk for the row this lane provides to scale A
// (scale_a_row) is computed by this lane of the quad: groups 0 and 2 by quad positions 0/1 (tokens 8q + e, q < 2),
// groups 1 and 3 by 2/3; lane % 2 picks the row half, as scale_a_row does.
SAGE_SM120_FRAGMENT_FUNCTION int p_scale_source_lane(int lane, int group) {
  return lane - lane % 4 + 2 * (group % 2) + lane % 2;
}

} // namespace sage::device::sm120
