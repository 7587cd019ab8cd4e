// Builds an attention variant with the DSL, runs it on the GPU through the runtime and checks it against the
// CPU reference. Exit code 0 when it matches (or when there is no GPU, which it says), 1 otherwise.
//
//   build/examples/dsl_attention_example [tokens]
#include "sage/sage.h"
#include "sage/numerics/Quantizers.h"
#include "sage/reference/Metrics.h"
#include "sage/reference/Reference.h"
#include "sage/runtime/CudaDriver.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <vector>

using namespace sage;

namespace {

// A device buffer holding `values` as f16.
runtime::driver::DevicePointer upload(const std::vector<float> &values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i)
    bits[i] = numerics::floatToHalfBits(values[i]);
  const runtime::CudaDriver &driver = runtime::CudaDriver::instance();
  runtime::driver::DevicePointer pointer = driver.allocate(bits.size() * 2);
  driver.copyToDevice(pointer, bits.data(), bits.size() * 2);
  return pointer;
}

int run(int64_t tokens) {
  // 1. Describe the variant: SageAttention's INT8 Q.K^T with K smoothing, per-warp scales for Q, f16 P.V with an
  //    f16 accumulator flushed into f32 every 8 KV blocks, causal, with the LSE.
  using namespace sage::dsl;
  ir::Program program = attention("example")
                            .head_dim(128)
                            .qk(int8(per_warp).groups(32, 64).smooth_k())
                            .pv(f16(accum::f16_then_f32).flush_every(8))
                            .mask(causal)
                            .lse()
                            .build();
  std::printf("%s", program.print().c_str());

  const runtime::CudaDriver &driver = runtime::CudaDriver::instance();
  if (!driver.available()) {
    std::printf("dsl_attention_example: skipped, no GPU: %s\n", driver.status().reason.c_str());
    return 0;
  }

  // 2. Compile it for this GPU (cached on disk under $SAGEGEN_CACHE_DIR).
  runtime::AttentionRunnerOptions options;
  options.ir_fingerprint = program.fingerprint();
  runtime::AttentionRunner runner(program.variant(), options);
  std::printf("%s\n", runner.describe().c_str());

  // 3. Run it on random Q, K, V ([batch, heads, tokens, 128], f16, HND) and read O back.
  const int64_t heads = 4, dim = 128;
  using reference::Layout;
  using reference::StorageType;
  const auto q = reference::randomTensor(1, heads, tokens, dim, StorageType::f16, Layout::hnd, {1});
  const auto k = reference::randomTensor(1, heads, tokens, dim, StorageType::f16, Layout::hnd, {2, 0.0, 1.0, 4.0});
  const auto v = reference::randomTensor(1, heads, tokens, dim, StorageType::f16, Layout::hnd, {3});
  const schedules::ProblemShape shape{1, heads, heads, tokens, tokens, dim};
  const SageTensorStrides strides{heads * tokens * dim, tokens * dim, dim};
  runtime::driver::DevicePointer q_device = upload(q.values()), k_device = upload(k.values()),
                                 v_device = upload(v.values()), o_device = driver.allocate(q.values().size() * 2),
                                 lse_device = driver.allocate(heads * tokens * sizeof(float)),
                                 workspace = driver.allocate(runner.workspaceBytes(shape));
  runtime::AttentionTensors tensors;
  tensors.q = reinterpret_cast<void *>(q_device);
  tensors.k = reinterpret_cast<void *>(k_device);
  tensors.v = reinterpret_cast<void *>(v_device);
  tensors.o = reinterpret_cast<void *>(o_device);
  tensors.lse = reinterpret_cast<float *>(lse_device);
  tensors.q_strides = tensors.k_strides = tensors.v_strides = tensors.o_strides = strides;
  runner.run(shape, tensors, reinterpret_cast<void *>(workspace), runner.workspaceBytes(shape), nullptr);
  driver.synchronizeContext();
  std::vector<uint16_t> o_bits(q.values().size());
  driver.copyToHost(o_bits.data(), o_device, o_bits.size() * 2);
  std::vector<double> output(o_bits.size());
  for (size_t i = 0; i < o_bits.size(); ++i)
    output[i] = numerics::halfBitsToFloat(o_bits[i]);
  for (auto pointer : {q_device, k_device, v_device, o_device, lse_device, workspace})
    driver.free(pointer);

  // 4. Check it: against the CPU reference of the same variant, and against exact attention.
  const auto expected = reference::runReference(program.variant(), q, k, v);
  const auto exact = reference::exactAttention(q, k, v, /*causal=*/true);
  const auto vs_reference = reference::compareOutputs(expected.output, output);
  const auto vs_exact = reference::compareOutputs(exact.output, output);
  std::printf("vs CPU reference: cos %.6f rel-L1 %.4f; vs exact attention: cos %.6f rel-L1 %.4f\n",
              vs_reference.cosine_similarity, vs_reference.relative_l1, vs_exact.cosine_similarity,
              vs_exact.relative_l1);
  const bool ok = vs_reference.cosine_similarity >= 0.9999 && vs_exact.cosine_similarity >= 0.9999;
  std::printf("dsl_attention_example: %s\n", ok ? "OK" : "MISMATCH");
  return ok ? 0 : 1;
}

} // namespace

int main(int argc, char **argv) {
  try {
    return run(argc > 1 ? std::atoll(argv[1]) : 1000);
  } catch (const std::exception &error) {
    std::fprintf(stderr, "dsl_attention_example: %s\n", error.what());
    return 1;
  }
}
