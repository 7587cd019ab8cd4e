#include "OperandQuantizer.h"

#include "sage/numerics/Hadamard.h"
#include "sage/numerics/Quantizers.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <stdexcept>
#include <string>

namespace sage::reference {
namespace {

using namespace sage::numerics;

float maxCode(ElementType dtype) {
  switch (dtype) {
  case ElementType::int8:
    return 127.0f;
  case ElementType::int4:
    return 7.0f;
  case ElementType::e4m3:
    return 448.0f;
  case ElementType::e5m2:
    return 57344.0f;
  case ElementType::e2m1:
    return 6.0f;
  default:
    return 0.0f;
  }
}

// x * inverse rounded onto the dtype's grid, decoded back (no scale applied).
float roundToCode(ElementType dtype, float scaled) {
  switch (dtype) {
  case ElementType::int8:
    return static_cast<float>(roundToInt8(scaled));
  case ElementType::int4:
    return static_cast<float>(roundToInt4(scaled));
  case ElementType::e4m3:
    return e4m3BitsToFloat(floatToE4m3Bits(scaled));
  case ElementType::e5m2:
    return e5m2BitsToFloat(floatToE5m2Bits(scaled));
  case ElementType::e2m1:
    return e2m1BitsToFloat(floatToE2m1Bits(scaled));
  default:
    throw std::logic_error("roundToCode: not a quantized type");
  }
}

double castValue(ElementType dtype, float value) {
  switch (dtype) {
  case ElementType::f32:
    return value;
  case ElementType::f16:
    return roundToHalf(value);
  case ElementType::bf16:
    return roundToBfloat16(value);
  default:
    throw std::logic_error("castValue: not a cast type");
  }
}

// The scale group of element (t, c), and how many groups there are.
struct Grouping {
  Granularity granularity;
  int64_t tokens, dim, group_tokens;

  int64_t groupsPerRow() const {
    const int64_t size = microscaleGroupSize(granularity);
    return (dim + size - 1) / size;
  }

  int64_t count() const {
    switch (granularity) {
    case Granularity::per_tensor:
      return 1;
    case Granularity::per_token:
      return tokens;
    case Granularity::per_block:
    case Granularity::per_warp:
      return (tokens + group_tokens - 1) / group_tokens;
    case Granularity::per_thread:
      return (tokens + group_tokens - 1) / group_tokens * 8;
    case Granularity::per_channel:
      return dim;
    case Granularity::microscale_1x16:
    case Granularity::microscale_1x32:
      return tokens * groupsPerRow();
    case Granularity::none:
      break;
    }
    return 0;
  }

  int64_t of(int64_t t, int64_t c) const {
    switch (granularity) {
    case Granularity::per_tensor:
      return 0;
    case Granularity::per_token:
      return t;
    case Granularity::per_block:
    case Granularity::per_warp:
      return t / group_tokens;
    case Granularity::per_thread:
      return t / group_tokens * 8 + t % 8; // rows an mma thread group owns: t, t + 8, t + 16, ...
    case Granularity::per_channel:
      return c;
    case Granularity::microscale_1x16:
    case Granularity::microscale_1x32:
      return t * groupsPerRow() + c / microscaleGroupSize(granularity);
    case Granularity::none:
      break;
    }
    return 0;
  }
};

} // namespace

std::vector<double> quantizeOperand(const OperandMatrix &matrix, const QuantizerSpec &spec, int64_t tile_tokens) {
  std::vector<double> result(matrix.values.size());
  if (spec.granularity == Granularity::none && spec.static_scale <= 0.0) {
    std::transform(matrix.values.begin(), matrix.values.end(), result.begin(),
                   [&](float value) { return castValue(spec.dtype, value); });
    return result;
  }
  int64_t group_tokens = spec.group_tokens > 0 ? spec.group_tokens : tile_tokens;
  if ((spec.granularity == Granularity::per_block || spec.granularity == Granularity::per_warp ||
       spec.granularity == Granularity::per_thread) &&
      group_tokens <= 0)
    throw std::invalid_argument("quantizer: group_tokens must be positive for " +
                                std::string(nameOf(spec.granularity)));
  Grouping grouping{spec.granularity, matrix.tokens, matrix.dim, group_tokens};

  std::vector<float> amax(static_cast<size_t>(grouping.count()), 0.0f);
  for (int64_t t = 0; t < matrix.tokens; ++t)
    for (int64_t c = 0; c < matrix.dim; ++c) {
      float &slot = amax[grouping.of(t, c)];
      slot = std::max(slot, std::fabs(matrix.at(t, c)));
    }

  std::vector<SymmetricScale> scales(amax.size());
  for (size_t g = 0; g < amax.size(); ++g) {
    if (spec.scale_type == ScaleType::ue4m3) {
      // NVFP4: the microscale itself is stored in UE4M3, so quantize with the rounded scale.
      float scale = ue4m3BitsToFloat(nvfp4ScaleBits(amax[g]));
      scales[g] = {scale, scale > 0.0f ? 1.0f / scale : 0.0f};
    } else if (spec.scale_type == ScaleType::ue8m0) {
      // MXFP4: a power-of-two scale, whose inverse is exact (quantizeMxfp4Row's arithmetic).
      const int code = mxfp4ScaleBits(amax[g]);
      scales[g] = {ue8m0BitsToFloat(static_cast<uint8_t>(code)), std::ldexp(1.0f, 127 - code)};
    } else {
      scales[g] = symmetricScale(amax[g], maxCode(spec.dtype));
    }
  }

  for (int64_t t = 0; t < matrix.tokens; ++t)
    for (int64_t c = 0; c < matrix.dim; ++c) {
      const SymmetricScale &scale = scales[grouping.of(t, c)];
      float code = roundToCode(spec.dtype, matrix.at(t, c) * scale.inverse);
      result[t * matrix.dim + c] = static_cast<double>(code) * static_cast<double>(scale.scale);
    }
  return result;
}

void quantizeProbabilities(std::vector<double> &row, const QuantizerSpec &spec) {
  if (spec.granularity == Granularity::none && spec.static_scale <= 0.0) {
    if (spec.dtype == ElementType::f32)
      return; // "f32" P is full precision: the exact preset's P is not rounded
    for (double &p : row)
      p = castValue(spec.dtype, static_cast<float>(p));
    return;
  }
  if (spec.static_scale > 0.0) {
    // A static scale s: codes = round(p * (1/s)) with 1/s and s as the kernel holds them, in f32.
    float scale = static_cast<float>(spec.static_scale);
    float inverse = static_cast<float>(1.0 / spec.static_scale);
    for (double &p : row)
      p = static_cast<double>(roundToCode(spec.dtype, static_cast<float>(p) * inverse)) * scale;
    return;
  }
  OperandMatrix matrix{1, static_cast<int64_t>(row.size()), {}};
  matrix.values.reserve(row.size());
  float row_scale = 1.0f;
  if (spec.two_level) {
    // SageAttention3: a per-row f32 scale first brings the row to [0, 448 * 6], the range that a UE4M3
    // microscale times an E2M1 value can express, then the 1x16 microscales apply.
    float amax = 0.0f;
    for (double p : row)
      amax = std::max(amax, static_cast<float>(p));
    SymmetricScale first = symmetricScale(amax, 448.0f * 6.0f);
    row_scale = first.scale;
    for (double p : row)
      matrix.values.push_back(static_cast<float>(p) * first.inverse);
  } else {
    for (double p : row)
      matrix.values.push_back(static_cast<float>(p));
  }
  QuantizerSpec per_row = spec;
  if (per_row.granularity == Granularity::per_token)
    per_row.granularity = Granularity::per_tensor; // the row is the token
  std::vector<double> values = quantizeOperand(matrix, per_row, 1);
  for (size_t i = 0; i < row.size(); ++i)
    row[i] = values[i] * row_scale;
}

void rotateRows(OperandMatrix &matrix, uint32_t seed, bool for_k) {
  for (int64_t t = 0; t < matrix.tokens; ++t)
    hadamardRotate(std::span<float>(matrix.values.data() + t * matrix.dim, static_cast<size_t>(matrix.dim)), seed,
                   for_k);
}

std::vector<float> channelMean(const OperandMatrix &matrix, int64_t begin, int64_t end) {
  std::vector<float> mean(static_cast<size_t>(matrix.dim));
  for (int64_t c = 0; c < matrix.dim; ++c) {
    double sum = 0.0;
    for (int64_t t = begin; t < end; ++t)
      sum += matrix.at(t, c);
    mean[c] = static_cast<float>(sum / static_cast<double>(end - begin));
  }
  return mean;
}

void subtractRows(OperandMatrix &matrix, int64_t begin, int64_t end, const std::vector<float> &mean) {
  for (int64_t t = begin; t < end; ++t)
    for (int64_t c = 0; c < matrix.dim; ++c)
      matrix.values[t * matrix.dim + c] = matrix.at(t, c) - mean[c]; // one f32 subtraction
}

OperandMatrix headMatrix(const HostTensor &tensor, int64_t b, int64_t h) {
  OperandMatrix matrix{tensor.tokens(), tensor.dim(), {}};
  matrix.values.resize(static_cast<size_t>(tensor.tokens() * tensor.dim()));
  for (int64_t t = 0; t < tensor.tokens(); ++t)
    for (int64_t c = 0; c < tensor.dim(); ++c)
      matrix.values[t * tensor.dim() + c] = tensor.at(b, h, t, c);
  return matrix;
}

} // namespace sage::reference
