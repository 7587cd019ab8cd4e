// What the quantization prologue must leave in the workspace, computed on the CPU with the exact f32 arithmetic
// of sage/numerics/Quantizers.h and the generated kernels' summation order (per-thread strided partial sums, then
// the CTA's rows, then the slices, all in order), so that a GPU run can be compared byte for byte. The launch
// structure does not enter: only the geometry that fixes the order of the sums (threads per CTA, slices).
//
// Why a model and not dsl/reference: the reference returns attention outputs, not the workspace's bytes; this
// builds them from the reference's own quantizers (sage/numerics), adding only the layout and the order of sums.
//
// Covered: q_codes and q_scales (quantized, unsmoothed Q), k_mean, k_codes and k_scales (quantized K),
// v_codes / v_scales / v_mean (per-channel V) and v_values (an f16 copy of V); FP4 (NVFP4/MXFP4) Q, K and V^T
// codes and microscales from quantizeNvfp4Row / quantizeMxfp4Row; Q and K rotated before psi (issue 28). Not modelled:
// q_mean, delta_s and a smoothed Q, casts of an unquantized Q or K.
#pragma once

#include "sage/codegen/PrologueConfig.h"
#include "sage/numerics/Hadamard.h"
#include "sage/numerics/Quantizers.h"
#include "sage/reference/HostTensor.h"
#include "sage/schedules/WorkspaceLayout.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace sage::prologue_model {

struct ExpectedBuffer {
  std::string name;
  schedules::BufferSlice slice;
  std::vector<unsigned char> bytes; // slice.bytes of them
};

inline int64_t ceilDiv(int64_t value, int64_t divisor) { return (value + divisor - 1) / divisor; }

inline void storeFloat(std::vector<unsigned char> &bytes, int64_t index, float value) {
  std::memcpy(bytes.data() + index * 4, &value, 4);
}

inline unsigned char codeOf(ElementType dtype, float scaled) {
  return dtype == ElementType::e4m3 ? numerics::floatToE4m3Bits(scaled)
                                    : static_cast<unsigned char>(numerics::roundToInt8(scaled));
}

// FP4 microscaling of one row (NVFP4 for 16-element groups, MXFP4 for 32), packed two codes per byte (element 2k
// in the low nibble of byte k), one scale byte per group.
inline void quantizeFp4Row(const std::vector<float> &row, int group, unsigned char *codes, unsigned char *scales) {
  std::vector<uint8_t> unpacked(row.size()), scale_codes(row.size() / static_cast<size_t>(group));
  if (group == 16)
    numerics::quantizeNvfp4Row(row, 1.0f, unpacked, scale_codes);
  else
    numerics::quantizeMxfp4Row(row, unpacked, scale_codes);
  for (size_t i = 0; i < row.size(); i += 2)
    codes[i / 2] = static_cast<unsigned char>(unpacked[i] | unpacked[i + 1] << 4);
  std::copy(scale_codes.begin(), scale_codes.end(), scales);
}

// FP4 along the channels of every token of one head: codes [padded][d / 2], scales [padded][d / group].
template <class Values>
void quantizeFp4Tokens(int group, int64_t padded, int64_t d, Values x, unsigned char *codes, unsigned char *scales) {
  std::vector<float> row(static_cast<size_t>(d));
  for (int64_t token = 0; token < padded; ++token) {
    for (int64_t c = 0; c < d; ++c)
      row[c] = x(token, c);
    quantizeFp4Row(row, group, codes + token * d / 2, scales + token * d / group);
  }
}

// Sum of channel c over tokens [begin, end) of one head as a column-statistics CTA forms it: thread row r sums
// tokens begin + r, begin + r + rows_per_pass, ... in order; then the rows' partial sums are added in order.
inline float sliceSum(const reference::HostTensor &t, int64_t b, int64_t h, int64_t c, int64_t begin, int64_t end,
                      int64_t rows_per_pass) {
  float total = 0.0f;
  for (int64_t row = 0; row < rows_per_pass; ++row) {
    float partial = 0.0f;
    for (int64_t token = begin + row; token < end; token += rows_per_pass)
      partial += t.at(b, h, token, c);
    total += partial;
  }
  return total;
}

// Per-channel statistics of one KV head over the whole sequence, combined from the slices in order.
struct ColumnStatistics {
  std::vector<float> mean, low, high; // [d]
};

inline ColumnStatistics columnStatistics(const codegen::PrologueConfig &config, const reference::HostTensor &t,
                                         int64_t b, int64_t h, int64_t kv_heads) {
  const int64_t n = t.tokens(), d = t.dim();
  const int64_t for_parallelism = std::max<int64_t>(1, ceilDiv(config.statistics_ctas_per_tensor, kv_heads));
  const int64_t slices = std::min({for_parallelism, ceilDiv(n, config.tunables.statistics_min_slice_tokens),
                                   static_cast<int64_t>(config.tunables.max_statistics_slices)});
  const int64_t slice_tokens = ceilDiv(n, slices);
  int64_t lanes_per_row = 1; // d / 8 vectors on a power-of-two group of lanes (sage/device/prologue/token_tile.cuh)
  while (lanes_per_row < d / 8)
    lanes_per_row *= 2;
  const int64_t rows_per_pass = config.tunables.threads / lanes_per_row;
  ColumnStatistics statistics;
  for (int64_t c = 0; c < d; ++c) {
    float sum = 0.0f;
    for (int64_t slice = 0; slice < slices; ++slice)
      sum +=
          sliceSum(t, b, h, c, slice * slice_tokens, std::min(n, slice * slice_tokens + slice_tokens), rows_per_pass);
    statistics.mean.push_back(sum / static_cast<float>(n));
    float low = std::numeric_limits<float>::infinity(), high = -low;
    for (int64_t token = 0; token < n; ++token) {
      low = std::min(low, t.at(b, h, token, c));
      high = std::max(high, t.at(b, h, token, c));
    }
    statistics.low.push_back(low);
    statistics.high.push_back(high);
  }
  return statistics;
}

// psi on one head of a token-major operand: x(token, c) for tokens < padded (0 past the sequence), one scale per
// group (per_tensor: `tensor_amax` for all), codes [padded][d] and scales [scale_count].
template <class Values>
void quantizeTokens(const codegen::TokenQuantizerConfig &quantizer, const QuantizerSpec &spec, int64_t padded,
                    int64_t d, int64_t scale_count, Values x, float tensor_amax, unsigned char *codes, float *scales) {
  const auto groupOf = [&](int64_t token) {
    return quantizer.perTensor() ? 0 : schedules::scaleGroupOfToken(spec, quantizer.tile_tokens, token);
  };
  std::vector<float> amax(static_cast<size_t>(scale_count), 0.0f);
  if (quantizer.perTensor())
    amax[0] = tensor_amax;
  else
    for (int64_t token = 0; token < padded; ++token)
      for (int64_t c = 0; c < d; ++c)
        amax[groupOf(token)] = std::max(amax[groupOf(token)], std::fabs(x(token, c)));
  std::vector<numerics::SymmetricScale> scale;
  for (int64_t group = 0; group < scale_count; ++group) {
    scale.push_back(numerics::symmetricScale(amax[group], quantizer.codeMax()));
    scales[group] = scale.back().scale;
  }
  for (int64_t token = 0; token < padded; ++token)
    for (int64_t c = 0; c < d; ++c)
      codes[token * d + c] = codeOf(quantizer.dtype, x(token, c) * scale[groupOf(token)].inverse);
}

// x of every token of one head [padded][d], rotated token by token as the prologue's rotateTile does (issue 28;
// sage/numerics/Hadamard.h) when the variant rotates Q and K; empty otherwise.
template <class Values>
std::vector<float> rotatedTokens(const codegen::PrologueConfig &config, int64_t padded, int64_t d, Values x,
                                 bool for_k) {
  if (!config.rotation_seed)
    return {};
  std::vector<float> rows(static_cast<size_t>(padded * d));
  for (int64_t token = 0; token < padded; ++token) {
    for (int64_t c = 0; c < d; ++c)
      rows[token * d + c] = x(token, c);
    numerics::hadamardRotate(std::span<float>(rows.data() + token * d, static_cast<size_t>(d)), *config.rotation_seed,
                             for_k);
  }
  return rows;
}

inline std::vector<ExpectedBuffer> expectedWorkspace(const AttentionVariant &variant,
                                                     const codegen::PrologueConfig &config,
                                                     const schedules::WorkspaceLayout &layout,
                                                     const reference::HostTensor &q, const reference::HostTensor &k,
                                                     const reference::HostTensor &v, float q_prescale) {
  std::vector<ExpectedBuffer> buffers;
  buffers.reserve(16); // add() hands out references into it
  const auto add = [&](const char *name, const schedules::BufferSlice &slice) -> std::vector<unsigned char> & {
    buffers.push_back({name, slice, std::vector<unsigned char>(slice.bytes, 0)});
    return buffers.back().bytes;
  };
  const int64_t d = q.dim(), batch = q.batch(), heads_q = q.heads(), heads_kv = k.heads();
  const int64_t padded_q = layout.padded_q, padded_kv = layout.padded_kv;
  // psi_Q's x without Q smoothing: Q, times q_prescale when folded; 0 past the sequence.
  const auto q_input = [&](int64_t b, int64_t h, int64_t token, int64_t c) {
    if (token >= q.tokens())
      return 0.0f;
    return config.fold_q_scale ? q.at(b, h, token, c) * q_prescale : q.at(b, h, token, c);
  };

  if (config.q.microscaled() && !config.smooth_q) {
    std::vector<unsigned char> &codes = add("q_codes", layout.q_codes);
    std::vector<unsigned char> &scales = add("q_scales", layout.q_scales);
    const int group = config.q.groupChannels();
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads_q; ++h) {
        const int64_t head = b * heads_q + h;
        const auto x = [&](int64_t token, int64_t c) { return q_input(b, h, token, c); };
        quantizeFp4Tokens(group, padded_q, d, x, codes.data() + head * padded_q * d / 2,
                          scales.data() + head * padded_q * d / group);
      }
  } else if (!config.q.cast() && !config.smooth_q && !config.q.microscaled()) {
    std::vector<unsigned char> &codes = add("q_codes", layout.q_codes);
    std::vector<unsigned char> &scales = add("q_scales", layout.q_scales);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads_q; ++h) {
        const int64_t head = b * heads_q + h;
        const auto x = [&](int64_t token, int64_t c) { return q_input(b, h, token, c); };
        float tensor_amax = 0.0f;
        for (int64_t token = 0; token < q.tokens(); ++token)
          for (int64_t c = 0; c < d; ++c)
            tensor_amax = std::max(tensor_amax, std::fabs(x(token, c)));
        const std::vector<float> rotated = rotatedTokens(config, padded_q, d, x, false);
        const auto psi_input = [&](int64_t token, int64_t c) {
          return rotated.empty() ? x(token, c) : rotated[token * d + c];
        };
        quantizeTokens(config.q, variant.q, padded_q, d, layout.q_scale_count, psi_input, tensor_amax,
                       codes.data() + head * padded_q * d,
                       reinterpret_cast<float *>(scales.data()) + head * layout.q_scale_count);
      }
  }

  std::vector<unsigned char> *k_mean = config.smooth_k ? &add("k_mean", layout.k_mean) : nullptr;
  std::vector<unsigned char> *k_codes = config.k.cast() ? nullptr : &add("k_codes", layout.k_codes);
  std::vector<unsigned char> *k_scales = config.k.cast() ? nullptr : &add("k_scales", layout.k_scales);
  const bool v_codes = config.v_output == codegen::VOutput::codes;
  const bool v_fp4 = config.v_output == codegen::VOutput::fp4_codes;
  std::vector<unsigned char> *v_code_bytes = v_codes || v_fp4 ? &add("v_codes", layout.v_codes) : nullptr;
  std::vector<unsigned char> *v_scales = v_codes || v_fp4 ? &add("v_scales", layout.v_scales) : nullptr;
  std::vector<unsigned char> *v_mean = config.smooth_v ? &add("v_mean", layout.v_mean) : nullptr;
  std::vector<unsigned char> *v_values =
      config.v_output == codegen::VOutput::f16_values ? &add("v_values", layout.v_values) : nullptr;
  const int64_t n = k.tokens();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads_kv; ++h) {
      const int64_t head = b * heads_kv + h;
      const ColumnStatistics ks = columnStatistics(config, k, b, h, batch * heads_kv);
      const ColumnStatistics vs = columnStatistics(config, v, b, h, batch * heads_kv);
      for (int64_t c = 0; c < d; ++c) {
        if (k_mean)
          storeFloat(*k_mean, head * d + c, ks.mean[c]);
        if (v_mean)
          storeFloat(*v_mean, head * d + c, vs.mean[c]);
      }
      // psi_K's x: K, minus mean(K) when smoothed; 0 past the sequence.
      const auto x = [&](int64_t token, int64_t c) {
        if (token >= n)
          return 0.0f;
        return config.smooth_k ? k.at(b, h, token, c) - ks.mean[c] : k.at(b, h, token, c);
      };
      if (k_codes && config.k.microscaled()) {
        const int group = config.k.groupChannels();
        quantizeFp4Tokens(group, padded_kv, d, x, k_codes->data() + head * padded_kv * d / 2,
                          k_scales->data() + head * padded_kv * d / group);
      } else if (k_codes) {
        float tensor_amax = 0.0f; // from min and max, as the kernels do (x -> x - mean is monotonic)
        for (int64_t c = 0; c < d; ++c) {
          const float shift = config.smooth_k ? ks.mean[c] : 0.0f;
          const float high = config.smooth_k ? ks.high[c] - shift : ks.high[c];
          const float low = config.smooth_k ? ks.low[c] - shift : ks.low[c];
          tensor_amax = std::max(tensor_amax, std::max(std::fabs(high), std::fabs(low)));
        }
        const std::vector<float> rotated = rotatedTokens(config, padded_kv, d, x, true);
        const auto psi_input = [&](int64_t token, int64_t c) {
          return rotated.empty() ? x(token, c) : rotated[token * d + c];
        };
        quantizeTokens(config.k, variant.k, padded_kv, d, layout.k_scale_count, psi_input, tensor_amax,
                       k_codes->data() + head * padded_kv * d,
                       reinterpret_cast<float *>(k_scales->data()) + head * layout.k_scale_count);
      }
      const auto vx = [&](int64_t token, int64_t c) {
        if (token >= n)
          return 0.0f;
        return config.smooth_v ? v.at(b, h, token, c) - vs.mean[c] : v.at(b, h, token, c);
      };
      if (v_codes)
        for (int64_t c = 0; c < d; ++c) {
          const float high = config.smooth_v ? vs.high[c] - vs.mean[c] : vs.high[c];
          const float low = config.smooth_v ? vs.low[c] - vs.mean[c] : vs.low[c];
          const numerics::SymmetricScale scale =
              numerics::symmetricScale(std::max(std::fabs(high), std::fabs(low)), config.vCodeMax());
          storeFloat(*v_scales, head * d + c, scale.scale);
          for (int64_t token = 0; token < padded_kv; ++token)
            (*v_code_bytes)[(head * d + c) * padded_kv + token] = codeOf(config.v_dtype, vx(token, c) * scale.inverse);
        }
      if (v_fp4) { // V^T: each channel's row of tokens, microscaled along the tokens
        const int group = config.vGroupTokens();
        std::vector<float> row(static_cast<size_t>(padded_kv));
        for (int64_t c = 0; c < d; ++c) {
          for (int64_t token = 0; token < padded_kv; ++token)
            row[token] = vx(token, c);
          quantizeFp4Row(row, group, v_code_bytes->data() + (head * d + c) * padded_kv / 2,
                         v_scales->data() + (head * d + c) * padded_kv / group);
        }
      }
      if (v_values)
        for (int64_t token = 0; token < padded_kv; ++token)
          for (int64_t c = 0; c < d; ++c) {
            const uint16_t bits = numerics::floatToHalfBits(vx(token, c));
            std::memcpy(v_values->data() + ((head * padded_kv + token) * d + c) * 2, &bits, 2);
          }
    }
  return buffers;
}

} // namespace sage::prologue_model
