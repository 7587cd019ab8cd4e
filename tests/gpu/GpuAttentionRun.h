// One attention call on the GPU for the gpu_attention_test sources: device copies of host tensors and runOnGpu (O and
// the LSE of a program on q, k, v through runtime::AttentionRunner).
#pragma once

#include "sage/dsl/Presets.h"
#include "sage/numerics/Quantizers.h"
#include "sage/reference/Reference.h"
#include "sage/runtime/AttentionRunner.h"
#include "sage/runtime/CudaDriver.h"

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace sage::test {

using namespace sage::reference;

// A device copy of a host tensor in its storage layout, as 16-bit values.
struct DeviceTensor {
  const runtime::CudaDriver &driver = runtime::CudaDriver::instance();
  runtime::driver::DevicePointer pointer = 0;
  size_t bytes = 0;
  DeviceTensor(const HostTensor &tensor) : bytes(tensor.values().size() * 2) {
    std::vector<uint16_t> bits(tensor.values().size());
    for (size_t i = 0; i < bits.size(); ++i)
      bits[i] = tensor.storage() == StorageType::bf16 ? numerics::floatToBfloat16Bits(tensor.values()[i])
                                                      : numerics::floatToHalfBits(tensor.values()[i]);
    pointer = driver.allocate(bytes);
    driver.copyToDevice(pointer, bits.data(), bytes);
  }
  explicit DeviceTensor(size_t size_bytes) : bytes(size_bytes) {
    pointer = driver.allocate(bytes);
    driver.fillBytes(pointer, 0xff, bytes); // NaN patterns: anything the kernel forgets to write shows up
  }
  ~DeviceTensor() { driver.free(pointer); }
  void *get() const { return reinterpret_cast<void *>(pointer); }
};

inline SageTensorStrides stridesOf(const HostTensor &tensor) {
  const int64_t d = tensor.dim();
  if (tensor.layout() == Layout::hnd)
    return {tensor.heads() * tensor.tokens() * d, tensor.tokens() * d, d};
  return {tensor.heads() * tensor.tokens() * d, d, tensor.heads() * d};
}

// O and the LSE of one GPU run of `program` on q, k, v (the runner's describe() in `description`).
struct GpuRun {
  std::vector<double> output;
  std::vector<float> lse;
  std::string description;
};

// `block_mask`: a block-sparse variant's mask (null: every block).
inline GpuRun runOnGpu(const ir::Program &program, const HostTensor &q, const HostTensor &k, const HostTensor &v,
                       const std::filesystem::path &aot_directory = {}, const std::string &schedule = {},
                       const BlockMask *block_mask = nullptr) {
  const AttentionVariant variant = program.variant();
  const StorageType storage = q.storage();
  const int64_t batch = q.batch(), heads_q = q.heads(), tokens_q = q.tokens(), head_dim = q.dim();
  runtime::AttentionRunnerOptions options;
  options.input = storage == StorageType::bf16 ? schedules::InputType::bf16 : schedules::InputType::f16;
  options.ir_fingerprint = program.fingerprint();
  options.aot_directory = aot_directory;
  options.schedule = schedule;
  runtime::AttentionRunner runner(variant, options);
  const schedules::ProblemShape shape{batch, heads_q, k.heads(), tokens_q, k.tokens(), head_dim};

  DeviceTensor q_device(q), k_device(k), v_device(v);
  HostTensor o_host(batch, heads_q, tokens_q, head_dim, storage, q.layout());
  DeviceTensor o_device(o_host.values().size() * 2);
  DeviceTensor lse_device(static_cast<size_t>(batch * heads_q * tokens_q) * sizeof(float));
  std::optional<DeviceTensor> mask_device;
  if (block_mask) {
    mask_device.emplace(block_mask->keep.size());
    runtime::CudaDriver::instance().copyToDevice(mask_device->pointer, block_mask->keep.data(), mask_device->bytes);
  }
  DeviceTensor workspace(runner.workspaceBytes(shape));
  runtime::AttentionTensors tensors;
  tensors.q = q_device.get();
  tensors.k = k_device.get();
  tensors.v = v_device.get();
  tensors.o = o_device.get();
  tensors.q_strides = stridesOf(q);
  tensors.k_strides = stridesOf(k);
  tensors.v_strides = stridesOf(v);
  tensors.o_strides = stridesOf(o_host);
  tensors.lse = static_cast<float *>(lse_device.get());
  tensors.block_mask = mask_device ? static_cast<const unsigned char *>(mask_device->get()) : nullptr;
  runner.run(shape, tensors, workspace.get(), workspace.bytes, nullptr);
  runtime::CudaDriver::instance().synchronizeContext();

  GpuRun run;
  run.description = runner.describe();
  std::vector<uint16_t> o_bits(o_host.values().size());
  runtime::CudaDriver::instance().copyToHost(o_bits.data(), o_device.pointer, o_device.bytes);
  run.lse.resize(static_cast<size_t>(batch * heads_q * tokens_q));
  runtime::CudaDriver::instance().copyToHost(run.lse.data(), lse_device.pointer, lse_device.bytes);
  run.output.resize(static_cast<size_t>(batch * heads_q * tokens_q * head_dim));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads_q; ++h)
      for (int64_t t = 0; t < tokens_q; ++t)
        for (int64_t d = 0; d < head_dim; ++d) {
          const uint16_t bits = o_bits[o_host.offset(b, h, t, d)];
          run.output[((b * heads_q + h) * tokens_q + t) * head_dim + d] =
              storage == StorageType::bf16 ? numerics::bfloat16BitsToFloat(bits) : numerics::halfBitsToFloat(bits);
        }
  return run;
}

} // namespace sage::test
