// The sm80 kernel's index arithmetic (codegen/device/sage/device/sm80/layout.cuh, compiled here by the host compiler):
// S's columns map to the KV tokens FragmentLayout.h's model of the mma fragments says (plain and interleaved for
// 8-bit P.V, where two S tiles must pack into one m16n8k32 A register without moving data), and the swizzle places
// every 16-byte chunk of a tile once while the 8 rows one ldmatrix phase reads fall in 8 different bank groups.
#include "../../codegen/device/sage/device/sm80/layout.cuh"

#include "sage/codegen/FragmentLayout.h"

#include <doctest/doctest.h>

#include <set>

using namespace sage;
namespace sm80 = sage::device::sm80;

namespace {

template <int kRowChunks> void checkSwizzle(int rows) {
  CAPTURE(kRowChunks);
  std::set<unsigned> offsets;
  for (int row = 0; row < rows; ++row)
    for (int chunk = 0; chunk < kRowChunks; ++chunk) {
      const unsigned offset = sm80::swizzled_offset<kRowChunks>(row, chunk);
      CHECK(offset % sm80::kChunkBytes == 0);
      CHECK(offset / (kRowChunks * sm80::kChunkBytes) == static_cast<unsigned>(row)); // stays in its row
      offsets.insert(offset);
    }
  CHECK(offsets.size() == static_cast<size_t>(rows * kRowChunks)); // a bijection onto the tile's chunks
  // One ldmatrix phase: 8 consecutive rows (from a multiple of 8), one chunk each -> 8 distinct 16-byte bank groups.
  for (int first = 0; first < rows; first += sm80::kLdmatrixRows)
    for (int chunk = 0; chunk < kRowChunks; ++chunk) {
      std::set<unsigned> bank_groups;
      for (int row = first; row < first + sm80::kLdmatrixRows; ++row)
        bank_groups.insert(sm80::swizzled_offset<kRowChunks>(row, chunk) / sm80::kChunkBytes % sm80::kBankLineChunks);
      CHECK(bank_groups.size() == static_cast<size_t>(sm80::kLdmatrixRows));
    }
}

} // namespace

TEST_CASE("S's columns are the KV tokens of FragmentLayout's model, in order or interleaved for 8-bit P.V") {
  for (int tile = 0; tile < 16; ++tile)
    for (int column = 0; column < sm80::kMmaColumns; ++column) {
      CAPTURE(tile);
      CAPTURE(column);
      CHECK(sm80::ScoreColumns<false, 16>::kv_token_of_column(tile, column) ==
            codegen::scoreColumnToken(false, tile, column));
      CHECK(sm80::ScoreColumns<true, 32>::kv_token_of_column(tile, column) ==
            codegen::scoreColumnToken(true, tile, column));
    }
  // Interleaved: a permutation of each 32-token k step.
  std::set<int> tokens;
  for (int tile = 0; tile < 4; ++tile)
    for (int column = 0; column < sm80::kMmaColumns; ++column)
      tokens.insert(sm80::ScoreColumns<true, 32>::kv_token_of_column(tile, column));
  CHECK(tokens.size() == 32);
  CHECK(*tokens.rbegin() == 31);
}

TEST_CASE("the swizzle places every chunk once and spreads an ldmatrix phase over all banks") {
  checkSwizzle<2>(64);  // 32-byte rows: V^T codes of a 32-token block
  checkSwizzle<4>(64);  // 64-byte rows: int8 d64
  checkSwizzle<8>(64);  // 128-byte rows: int8 d128, f16 d64
  checkSwizzle<16>(64); // 256-byte rows: f16 d128
}

TEST_CASE("a chunk step whose bits are disjoint from the lane's commutes with the swizzle (tile_address)") {
  constexpr int kRowChunks = 8;
  for (int row = 0; row < 16; ++row)
    for (int chunk = 0; chunk < 2; ++chunk)
      for (int step = 0; step < kRowChunks; step += 2) {
        const unsigned lane_offset = sm80::swizzled_offset<kRowChunks>(row, chunk);
        CHECK(sm80::tile_address(0, lane_offset, 0, step) == sm80::swizzled_offset<kRowChunks>(row, chunk + step));
        // Whole 8-row groups keep the row's swizzle.
        CHECK(sm80::tile_address(0, lane_offset, 8 * kRowChunks * sm80::kChunkBytes, step) ==
              sm80::swizzled_offset<kRowChunks>(row + 8, chunk + step));
      }
}

TEST_CASE("scale groups: one per tokens_per_group tokens, interleaved, or one for the sequence") {
  CHECK(sm80::scale_group<0, 1>(12345) == 0);
  CHECK(sm80::scale_group<64, 1>(63) == 0);
  CHECK(sm80::scale_group<64, 1>(64) == 1);
  CHECK(sm80::scale_group<1, 1>(77) == 77);
  // Interleaved (per-thread quantization): token t of a 32-token group belongs to slot t % 8 of the group's 8.
  CHECK(sm80::scale_group<32, 8>(0) == 0);
  CHECK(sm80::scale_group<32, 8>(9) == 1);
  CHECK(sm80::scale_group<32, 8>(33) == 9);
}
