// The quantization prologue's generic tile quantizer psi (int8, int4 and e4m3 codes with one scale per group of
// rows) and the cast that stands in for it. Quantizer is the generated QQuantizer / KQuantizer. The generator pastes
// this header after its constants and shared-memory offsets (kTileGroupAmaxOffset, kTileGroupInverseOffset),
// scalar_helpers.cuh, the input header, token_tile.cuh and tile_reductions.cuh, whose names it uses.
#pragma once

namespace sage::device::prologue {

// Codes of one tile row by row: code = convert(x * inverse), one f32 product per element, to `codes`
// [kTileTokens x kHeadDim]; rows past the sequence hold x = 0 and get code 0; rows from `stored_rows` on lie
// past the padded sequence and are not stored.
template <class Quantizer, class Values, class InverseOfRow>
__device__ __forceinline__ void storeTileCodes(const Values &values, unsigned char *codes, int stored_rows,
                                               InverseOfRow inverse_of_row) {
  using Tile = TokenTile<Quantizer::kTileTokens>;
#pragma unroll
  for (int pass = 0; pass < Tile::kPasses; ++pass) {
    const int row = Tile::row(pass);
    if (!Tile::inTile(pass) || row >= stored_rows)
      continue;
    const float inverse = inverse_of_row(row);
    float scaled[kVectorElements];
#pragma unroll
    for (int j = 0; j < kVectorElements; ++j)
      scaled[j] = __fmul_rn(values(pass, j), inverse);
    *(uint2 *)(codes + row * kHeadDim + Tile::channel()) = Quantizer::pack(scaled);
  }
}

// The cast of one tile (an unquantized Q or K): every x rounded to the input type, one 16-byte store per thread
// and row, to `values` [kTileTokens x kHeadDim]; rows past the sequence hold x = 0; rows from `stored_rows` on
// lie past the padded sequence and are not stored.
template <class Quantizer, class Values>
__device__ __forceinline__ void storeTileValues(const Values &values, unsigned short *out, int stored_rows) {
  using Tile = TokenTile<Quantizer::kTileTokens>;
#pragma unroll
  for (int pass = 0; pass < Tile::kPasses; ++pass) {
    const int row = Tile::row(pass);
    if (!Tile::inTile(pass) || row >= stored_rows)
      continue;
    unsigned words[4];
#pragma unroll
    for (int pair = 0; pair < 4; ++pair)
      words[pair] = (unsigned)roundToInput(values(pass, 2 * pair)) | (unsigned)roundToInput(values(pass, 2 * pair + 1))
                                                                         << 16;
    *(uint4 *)(out + (long long)row * kHeadDim + Tile::channel()) = uint4{words[0], words[1], words[2], words[3]};
  }
}

// max_j |values(pass, j)|: the Values' own rowVectorAmax where it has one (a faster exact form), else every element.
template <class Values>
__device__ __forceinline__ auto rowVectorAmaxOf(const Values &values, int pass, int)
    -> decltype(values.rowVectorAmax(pass)) {
  return values.rowVectorAmax(pass);
}
template <class Values> __device__ __forceinline__ float rowVectorAmaxOf(const Values &values, int pass, long) {
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < kVectorElements; ++j)
    amax = fmaxf(amax, fabsf(values(pass, j)));
  return amax;
}

// psi on one tile with one scale per group of rows: the amax of every group, scale = amax / qmax and
// inverse = qmax / amax per group (the first `stored_groups` scales to `scales`), then the codes of the first
// `stored_rows` rows. values(pass, j) is the f32 x.
template <class Quantizer, class Values>
__device__ __forceinline__ void quantizeTile(const Values &values, unsigned char *codes, float *scales, int stored_rows,
                                             int stored_groups, unsigned char *shared) {
  using Tile = TokenTile<Quantizer::kTileTokens>;
  unsigned *group_amax = (unsigned *)(shared + kTileGroupAmaxOffset);
  float *group_inverse = (float *)(shared + kTileGroupInverseOffset);
  for (int group = threadIdx.x; group < Quantizer::kGroupsPerTile; group += kThreads)
    group_amax[group] = 0u;
  __syncthreads();
  // 1. amax of each group: a row's lanes reduce with shuffles, then the row's first lane folds the row in.
#pragma unroll
  for (int pass = 0; pass < Tile::kPasses; ++pass) {
    const float amax = rowMax(rowVectorAmaxOf(values, pass, 0));
    if (laneInRow() == 0 && Tile::inTile(pass))
      atomicMax(&group_amax[Quantizer::groupOfRow(Tile::row(pass))], __float_as_uint(amax));
  }
  __syncthreads();
  // 2. One f32 scale and inverse per group.
  for (int group = threadIdx.x; group < Quantizer::kGroupsPerTile; group += kThreads) {
    const SymmetricScale scale = symmetricScale(__uint_as_float(group_amax[group]), Quantizer::kCodeMax);
    if (group < stored_groups)
      scales[group] = scale.scale;
    group_inverse[group] = scale.inverse;
  }
  __syncthreads();
  // 3. The codes.
  storeTileCodes<Quantizer>(values, codes, stored_rows,
                            [&](int row) { return group_inverse[Quantizer::groupOfRow(row)]; });
}

} // namespace sage::device::prologue
