// The LSE merge's checks, module and launch (MergeRunner.h).
#include "sage/runtime/MergeRunner.h"

#include "sage/runtime/ArgumentError.h"
#include "sage/runtime/AttentionKernelKeys.h"
#include "sage/runtime/DeviceArch.h"
#include "sage/runtime/GeneratedKernelLoader.h"
#include "sage/runtime/LoadedKernel.h"
#include "sage/runtime/ProcessResources.h"
#include "sage/runtime/TensorValidation.h"

#include <fmt/format.h>

#include <map>
#include <mutex>
#include <tuple>

namespace sage::runtime {
namespace {

codegen::MergeElement elementOf(const TensorDescription &tensor, const char *name) {
  switch (tensor.dtype) {
  case DataType::f16:
    return codegen::MergeElement::f16;
  case DataType::bf16:
    return codegen::MergeElement::bf16;
  case DataType::f32:
    return codegen::MergeElement::f32;
  default:
    throw ArgumentError(name, fmt::format("expected dtype f16, bf16 or f32, got {}", nameOf(tensor.dtype)));
  }
}

// An O tensor: 4-D, its own dtype, on `device`, o_out's shape, a head dim of stride 1.
void checkOutput(const TensorDescription &tensor, const char *name, int device, const TensorDescription &shape_of) {
  elementOf(tensor, name);
  checkTensorBasics(tensor, name, 4, tensor.dtype, device);
  if (tensor.shape != shape_of.shape)
    throw ArgumentError(name, fmt::format("expected o_out's shape {}, got {}", shapeText(shape_of), shapeText(tensor)));
  if (tensor.strides[3] != 1)
    throw ArgumentError(name, fmt::format("the head_dim stride (last) must be 1, got {}", tensor.strides[3]));
}

// An LSE: f32 [batch, heads, tokens] of an O of `o_shape` in `layout`.
void checkLse(const TensorDescription &tensor, const char *name, int device, const TensorDescription &o,
              TensorLayout layout) {
  checkTensorBasics(tensor, name, 3, DataType::f32, device);
  const bool hnd = layout == TensorLayout::hnd;
  checkShape(tensor, name, {o.shape[0], hnd ? o.shape[1] : o.shape[2], hnd ? o.shape[2] : o.shape[1]},
             "batch, heads, tokens");
}

// The same elements: same address, dtype and strides (the shapes are equal by then).
bool sameTensor(const TensorDescription &a, const TensorDescription &b) {
  return a.data == b.data && a.dtype == b.dtype && a.strides == b.strides;
}

// The row strides of an O tensor: its first three dimensions, which are the rows' (outer, middle, inner) order.
SageMergeRowStrides outputRowStrides(const TensorDescription &tensor) {
  return {tensor.strides[0], tensor.strides[1], tensor.strides[2]};
}

// An LSE's strides in the rows' order: [b, h, n] for HND, [b, n, h] (its dimensions 0, 2, 1) for NHD.
SageMergeRowStrides lseRowStrides(const TensorDescription &tensor, TensorLayout layout) {
  if (layout == TensorLayout::hnd)
    return {tensor.strides[0], tensor.strides[1], tensor.strides[2]};
  return {tensor.strides[0], tensor.strides[2], tensor.strides[1]};
}

// 16-byte accesses: the address and every row stride a multiple of 16 bytes (a chunk of 8 elements starts at one
// then, the head dim being a multiple of 8).
bool allowsVectors(const TensorDescription &tensor) {
  const int64_t bytes = bytesOf(tensor.dtype);
  if (reinterpret_cast<uintptr_t>(tensor.data) % 16 != 0)
    return false;
  for (int i = 0; i < 3; ++i)
    if (tensor.shape[i] > 1 && tensor.strides[i] * bytes % 16 != 0)
      return false;
  return true;
}

} // namespace

ValidatedMerge validateMergeCall(const MergeCall &call) {
  if (call.layout != TensorLayout::hnd && call.layout != TensorLayout::nhd)
    throw ArgumentError("layout", "expected HND or NHD");
  const TensorDescription &out = call.o_out;
  if (out.device < 0)
    throw ArgumentError("o_out", "is in host memory, expected a CUDA device");
  const int device = out.device;
  checkOutput(out, "o_out", device, out);
  checkOutput(call.o_a, "o_a", device, out);
  checkOutput(call.o_b, "o_b", device, out);
  const int64_t head_dim = out.shape[3];
  if (head_dim % SAGE_MERGE_CHUNK != 0 || head_dim > codegen::kMergeMaxHeadDim)
    throw ArgumentError("o_out", fmt::format("head_dim (last size) must be a multiple of {} up to {}, got {}",
                                             SAGE_MERGE_CHUNK, codegen::kMergeMaxHeadDim, head_dim));
  checkLse(call.lse_a, "lse_a", device, out, call.layout);
  checkLse(call.lse_b, "lse_b", device, out, call.layout);
  checkLse(call.lse_out, "lse_out", device, out, call.layout);
  checkNonOverlapping(out, "o_out");
  checkNonOverlapping(call.lse_out, "lse_out");

  // Written: o_out and lse_out. Each may be its part-A input exactly (then that input's region is the written one);
  // any other overlap is refused.
  const bool out_is_a = sameTensor(out, call.o_a), lse_out_is_a = sameTensor(call.lse_out, call.lse_a);
  MemoryRegions regions;
  regions.add(regionOf(call.o_a, "o_a", out_is_a));
  regions.add(regionOf(call.o_b, "o_b", false));
  regions.add(regionOf(call.lse_a, "lse_a", lse_out_is_a));
  regions.add(regionOf(call.lse_b, "lse_b", false));
  if (!out_is_a)
    regions.add(regionOf(out, "o_out", true));
  if (!lse_out_is_a)
    regions.add(regionOf(call.lse_out, "lse_out", true));
  regions.checkDisjoint();

  ValidatedMerge merge;
  merge.device = device;
  merge.types = {elementOf(call.o_a, "o_a"), elementOf(call.o_b, "o_b"), elementOf(out, "o_out")};
  SageMergeParams &p = merge.params;
  p.o_a = call.o_a.data;
  p.o_b = call.o_b.data;
  p.o_out = const_cast<void *>(out.data); // a description holds const pointers; o_out is the caller's output
  p.lse_a = static_cast<const float *>(call.lse_a.data);
  p.lse_b = static_cast<const float *>(call.lse_b.data);
  p.lse_out = static_cast<float *>(const_cast<void *>(call.lse_out.data));
  p.o_a_strides = outputRowStrides(call.o_a);
  p.o_b_strides = outputRowStrides(call.o_b);
  p.o_out_strides = outputRowStrides(out);
  p.lse_a_strides = lseRowStrides(call.lse_a, call.layout);
  p.lse_b_strides = lseRowStrides(call.lse_b, call.layout);
  p.lse_out_strides = lseRowStrides(call.lse_out, call.layout);
  p.middle = out.shape[1];
  p.inner = out.shape[2];
  p.rows = out.shape[0] * out.shape[1] * out.shape[2]; // fits: the extents were checked
  p.head_dim = static_cast<int>(head_dim);
  p.lanes_per_row = sage_merge_lanes_per_row(p.head_dim);
  p.vectorized = allowsVectors(call.o_a) && allowsVectors(call.o_b) && allowsVectors(out) ? 1 : 0;
  return merge;
}

GeneratedKernel generateMergeModule(const codegen::MergeTypes &types, schedules::GpuArch arch) {
  codegen::MergeKernelSource source = codegen::generateMergeKernel(types);
  GeneratedKernel kernel;
  kernel.role = AttentionKernelRole::merge;
  kernel.name = source.name;
  kernel.entry_point = std::string(codegen::kMergeKernel);
  kernel.source = std::move(source.source);
  kernel.uses_device_library = true;
  kernel.block = {static_cast<unsigned>(codegen::kMergeThreads), 1, 1};
  kernel.grid_rule = "codegen::mergeGridCtas(rows, head_dim)";
  const std::string dtypes =
      fmt::format("a={},b={},o={}", codegen::nameOf(types.a), codegen::nameOf(types.b), codegen::nameOf(types.out));
  kernel.key = mergeKernelKey(arch, dtypes, kernel.name, selfContainedSource(kernel));
  return kernel;
}

void runMerge(const ValidatedMerge &merge, driver::Stream stream) {
  const CudaDriver &driver = CudaDriver::instance();
  const driver::Context context = driver.primaryContext(merge.device);
  ScopedContext scope(driver, context);
  // The loaded kernels, per (device, types): a process-wide table, filled once per key under the lock; leaked, as
  // the driver is, so that no module is unloaded at exit after the contexts went away.
  static std::mutex mutex;
  static auto &kernels = *new std::map<std::tuple<int, int, int, int>, LoadedKernel>();
  const auto key = std::make_tuple(merge.device, static_cast<int>(merge.types.a), static_cast<int>(merge.types.b),
                                   static_cast<int>(merge.types.out));
  LoadedKernel kernel;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto found = kernels.find(key);
    if (found == kernels.end()) {
      const GeneratedKernel module_kernel = generateMergeModule(merge.types, currentDeviceArch());
      const std::shared_ptr<const AotKernelDirectory> aot = aotDirectoryFor({});
      const LoadedGeneratedKernel loaded = loadGeneratedKernel(module_kernel, processKernelCache(), aot.get());
      found = kernels.emplace(key, loaded.module->kernel(std::string(codegen::kMergeKernel))).first;
    }
    kernel = found->second;
  }
  const SageMergeParams &p = merge.params;
  LaunchConfig config;
  config.grid = {codegen::mergeGridCtas(p.rows, p.head_dim), 1, 1};
  config.block = {static_cast<unsigned>(codegen::kMergeThreads), 1, 1};
  config.stream = stream;
  kernel.launch(p, config);
}

} // namespace sage::runtime
