// The LSE merge kernel on the GPU (issue 30; runtime/MergeRunner.h) against a double-precision merge on the host:
// random O and LSE with masked rows (LSE -inf in part A, in part B, in both; the masked part's O is NaN) and rows
// whose LSEs would overflow unshifted, in both layouts, as row slices of larger tensors (strided), over the element
// types ring attention uses and others, in place (out = A) and into a new output, on the vector and the element
// path, head dims 8 to 512. Memory around each output view (other tokens, padded channels) must stay untouched.
// Skipped, with a message, where no GPU is present. Prints one line per case.
#include "sage/numerics/Quantizers.h"
#include "sage/runtime/CudaDriver.h"
#include "sage/runtime/MergeRunner.h"

#include "NanFilledDeviceBuffer.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace sage;
using namespace sage::runtime;

namespace {

using DeviceBuffer = test::NanFilledDeviceBuffer;
constexpr double kMinusInfinity = -std::numeric_limits<double>::infinity();

// Host bytes of a tensor in its storage type, all NaN to start with (0xff bytes, as the device buffer).
struct Storage {
  DataType dtype;
  std::vector<uint8_t> bytes;
  Storage(DataType type, size_t elements) : dtype(type), bytes(elements * bytesOf(type), 0xff) {}
  size_t size() const { return bytes.size() / bytesOf(dtype); }
  void set(size_t index, double value) {
    const float f = static_cast<float>(value);
    if (dtype == DataType::f32) {
      std::memcpy(&bytes[index * 4], &f, 4);
      return;
    }
    const uint16_t bits = dtype == DataType::f16 ? numerics::floatToHalfBits(f) : numerics::floatToBfloat16Bits(f);
    std::memcpy(&bytes[index * 2], &bits, 2);
  }
  double get(size_t index) const {
    if (dtype == DataType::f32) {
      float f;
      std::memcpy(&f, &bytes[index * 4], 4);
      return f;
    }
    uint16_t bits;
    std::memcpy(&bits, &bytes[index * 2], 2);
    return dtype == DataType::f16 ? numerics::halfBitsToFloat(bits) : numerics::bfloat16BitsToFloat(bits);
  }
};

struct MergeCase {
  const char *name;
  TensorLayout layout;
  int batch, heads, tokens, head_dim;
  int parent_tokens, first_token, channel_pad; // the views are tokens [first, first + tokens) of a larger tensor
  DataType a, b, out;
  bool in_place; // out = A, lse_out = lse_A
  bool expect_vectors;
};

// A 4-D O view (or a 3-D LSE view) of tokens [first, first + tokens) of a parent tensor, on the device.
struct View {
  Storage host;
  std::unique_ptr<DeviceBuffer> device;
  TensorDescription description;
  std::array<int64_t, 4> strides{}; // parent strides, in the view's logical order (b, h, n, c)
  int64_t offset = 0;               // of the view's first element
  size_t index(int b, int h, int n, int c) const {
    return static_cast<size_t>(offset + b * strides[0] + h * strides[1] + n * strides[2] + c * strides[3]);
  }
  void upload() {
    device = std::make_unique<DeviceBuffer>(host.bytes.size());
    device->driver.copyToDevice(device->pointer, host.bytes.data(), host.bytes.size());
    description.data = reinterpret_cast<const uint8_t *>(device->get()) + offset * bytesOf(host.dtype);
  }
  std::vector<uint8_t> download() const { return device->read<uint8_t>(0, host.bytes.size()); }
};

View outputView(const MergeCase &c, DataType dtype) {
  const int64_t dp = c.head_dim + c.channel_pad, n = c.parent_tokens, h = c.heads;
  View view{Storage(dtype, static_cast<size_t>(c.batch * h * n * dp)), nullptr, {}, {}, 0};
  const bool hnd = c.layout == TensorLayout::hnd;
  view.strides =
      hnd ? std::array<int64_t, 4>{h * n * dp, n * dp, dp, 1} : std::array<int64_t, 4>{n * h * dp, dp, h * dp, 1};
  view.offset = c.first_token * view.strides[2];
  TensorDescription &d = view.description;
  d.rank = 4;
  d.dtype = dtype;
  d.device = 0;
  d.shape = hnd ? std::array<int64_t, 4>{c.batch, h, c.tokens, c.head_dim}
                : std::array<int64_t, 4>{c.batch, c.tokens, h, c.head_dim};
  d.strides = hnd ? view.strides : std::array<int64_t, 4>{view.strides[0], view.strides[2], view.strides[1], 1};
  return view;
}

View lseView(const MergeCase &c) {
  const int64_t n = c.parent_tokens, h = c.heads;
  View view{Storage(DataType::f32, static_cast<size_t>(c.batch * h * n)), nullptr, {}, {h * n, n, 1, 0}, 0};
  view.offset = c.first_token;
  TensorDescription &d = view.description;
  d.rank = 3;
  d.dtype = DataType::f32;
  d.device = 0;
  d.shape = {c.batch, h, c.tokens, 0};
  d.strides = {h * n, n, 1, 0};
  return view;
}

void runCase(const MergeCase &c) {
  CAPTURE(c.name);
  std::mt19937_64 generator(0x5eed + c.head_dim * 7 + c.tokens);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uniform(-4.0, 4.0);
  View a = outputView(c, c.a), b = outputView(c, c.b), lse_a = lseView(c), lse_b = lseView(c);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // Inputs, and the reference computed from them as stored.
  const size_t rows = static_cast<size_t>(c.batch * c.heads * c.tokens);
  std::vector<double> expected_o(rows * c.head_dim), expected_lse(rows), magnitude(rows * c.head_dim);
  size_t row = 0;
  for (int bi = 0; bi < c.batch; ++bi)
    for (int hi = 0; hi < c.heads; ++hi)
      for (int ti = 0; ti < c.tokens; ++ti, ++row) {
        double la = uniform(generator), lb = uniform(generator);
        const bool masked_a = row % 7 == 3 || row % 11 == 0, masked_b = row % 7 == 5 || row % 11 == 0;
        if (row % 13 == 1)
          la = 5000.0, lb = 5001.0; // e^5000 overflows: the shift by the row max keeps it finite
        if (masked_a)
          la = kMinusInfinity;
        if (masked_b)
          lb = kMinusInfinity;
        lse_a.host.set(lse_a.index(bi, hi, ti, 0), la);
        lse_b.host.set(lse_b.index(bi, hi, ti, 0), lb);
        la = lse_a.host.get(lse_a.index(bi, hi, ti, 0));
        lb = lse_b.host.get(lse_b.index(bi, hi, ti, 0));
        const double top = std::max(la, lb);
        double wa = 0.0, wb = 0.0;
        if (top == kMinusInfinity) {
          expected_lse[row] = kMinusInfinity;
        } else {
          wa = la == kMinusInfinity ? 0.0 : std::exp(la - top);
          wb = lb == kMinusInfinity ? 0.0 : std::exp(lb - top);
          expected_lse[row] = top + std::log(wa + wb);
          const double total = wa + wb;
          wa /= total;
          wb /= total;
        }
        for (int ch = 0; ch < c.head_dim; ++ch) {
          a.host.set(a.index(bi, hi, ti, ch), masked_a ? nan : normal(generator));
          b.host.set(b.index(bi, hi, ti, ch), masked_b ? nan : normal(generator));
          const double va = a.host.get(a.index(bi, hi, ti, ch)), vb = b.host.get(b.index(bi, hi, ti, ch));
          const size_t at = row * c.head_dim + ch;
          expected_o[at] = (wa > 0.0 ? wa * va : 0.0) + (wb > 0.0 ? wb * vb : 0.0);
          magnitude[at] = (wa > 0.0 ? std::fabs(va) : 0.0) + (wb > 0.0 ? std::fabs(vb) : 0.0);
        }
      }
  for (View *view : {&a, &b, &lse_a, &lse_b})
    view->upload();
  View out = c.in_place ? View{a.host, nullptr, a.description, a.strides, a.offset} : outputView(c, c.out);
  View lse_out = c.in_place ? View{lse_a.host, nullptr, lse_a.description, lse_a.strides, lse_a.offset} : lseView(c);
  if (!c.in_place) {
    out.upload();
    lse_out.upload();
  }
  const Storage out_before = out.host, lse_out_before = lse_out.host; // what the device holds before the merge

  MergeCall call;
  call.layout = c.layout;
  call.o_a = a.description;
  call.o_b = b.description;
  call.o_out = c.in_place ? a.description : out.description;
  call.lse_a = lse_a.description;
  call.lse_b = lse_b.description;
  call.lse_out = c.in_place ? lse_a.description : lse_out.description;
  const ValidatedMerge merge = validateMergeCall(call);
  CHECK(merge.params.vectorized == (c.expect_vectors ? 1 : 0));
  runMerge(merge, nullptr);
  CudaDriver::instance().synchronizeContext();

  const View &out_device = c.in_place ? a : out;
  const View &lse_device = c.in_place ? lse_a : lse_out;
  Storage got_o(c.out, out_before.size()), got_lse(DataType::f32, lse_out_before.size());
  got_o.bytes = out_device.download();
  got_lse.bytes = lse_device.download();
  // The output type's rounding of the result, on top of f32 arithmetic (a few ulp on each weight).
  // f16's subnormals are spaced 2^-24 apart.
  const double rounding = c.out == DataType::f32 ? 0.0 : c.out == DataType::bf16 ? 1.0 / 256 : 1.0 / 2048;
  const double floor = c.out == DataType::f16 ? std::ldexp(1.0, -24) : 1e-30;
  std::vector<bool> in_view(got_o.size(), false), lse_in_view(got_lse.size(), false);
  double worst_o = 0.0, worst_lse = 0.0;
  row = 0;
  for (int bi = 0; bi < c.batch; ++bi)
    for (int hi = 0; hi < c.heads; ++hi)
      for (int ti = 0; ti < c.tokens; ++ti, ++row) {
        const size_t lse_index = lse_out.index(bi, hi, ti, 0);
        lse_in_view[lse_index] = true;
        const double lse = got_lse.get(lse_index), want = expected_lse[row];
        if (want == kMinusInfinity) {
          CHECK(lse == kMinusInfinity);
        } else {
          const double error = std::fabs(lse - want);
          worst_lse = std::max(worst_lse, error / (1.0 + std::fabs(want)));
          CHECK(error <= 1e-6 + 2.5e-7 * std::fabs(want));
        }
        for (int ch = 0; ch < c.head_dim; ++ch) {
          const size_t index = out.index(bi, hi, ti, ch), at = row * c.head_dim + ch;
          in_view[index] = true;
          const double value = got_o.get(index), target = expected_o[at];
          REQUIRE(std::isfinite(value));
          const double error = std::fabs(value - target);
          worst_o = std::max(worst_o, error / (1.0 + magnitude[at]));
          CHECK(error <= rounding * std::fabs(target) + 4e-6 * magnitude[at] + floor);
        }
      }
  // Everything outside the views is as it was (no stray writes: other tokens, padded channels).
  size_t stray = 0;
  const size_t o_bytes = bytesOf(c.out);
  for (size_t i = 0; i < got_o.size(); ++i)
    if (!in_view[i] && std::memcmp(&got_o.bytes[i * o_bytes], &out_before.bytes[i * o_bytes], o_bytes) != 0)
      ++stray;
  for (size_t i = 0; i < got_lse.size(); ++i)
    if (!lse_in_view[i] && std::memcmp(&got_lse.bytes[i * 4], &lse_out_before.bytes[i * 4], 4) != 0)
      ++stray;
  CHECK(stray == 0);
  std::printf("merge %-44s rows %6zu d %3d: max O error %.3g (of 1 + |terms|), max LSE error %.3g%s\n", c.name, rows,
              c.head_dim, worst_o, worst_lse, merge.params.vectorized ? "" : " [element path]");
}

} // namespace

TEST_CASE("the LSE merge kernel equals a double-precision merge, masked rows exactly") {
  const CudaDriver &driver = CudaDriver::instance();
  ScopedContext scope(driver, driver.primaryContext(0));
  using enum DataType;
  const TensorLayout hnd = TensorLayout::hnd, nhd = TensorLayout::nhd;
  const MergeCase cases[] = {
      {"ring step: f32 acc += bf16 part, HND slice", hnd, 2, 3, 37, 128, 50, 7, 0, f32, bf16, f32, true, true},
      {"ring step 1: bf16 + bf16 -> new f32, NHD slice", nhd, 2, 3, 37, 128, 50, 13, 0, bf16, bf16, f32, false, true},
      {"ring last step: f32 + bf16 -> bf16, NHD", nhd, 1, 4, 33, 64, 33, 0, 0, f32, bf16, bf16, false, true},
      {"f16 + f16 -> f16, HND slice, d 256", hnd, 1, 2, 45, 256, 64, 19, 0, f16, f16, f16, false, true},
      {"bf16 + f16 -> f32, padded rows (element path)", hnd, 2, 2, 21, 24, 30, 5, 4, bf16, f16, f32, false, false},
      {"f32 acc += f16, NHD, d 512 (lanes loop)", nhd, 1, 3, 17, 512, 20, 3, 0, f32, f16, f32, true, true},
      {"f16 + bf16 -> f16, d 8 (a lane per row)", hnd, 1, 5, 77, 8, 80, 1, 0, f16, bf16, f16, false, true},
      {"f32 + f32 -> f32, d 40, NHD padded (element path)", nhd, 1, 3, 29, 40, 29, 0, 2, f32, f32, f32, false, false},
  };
  for (const MergeCase &c : cases)
    runCase(c);
}
