// An application of an installed sagegen: describes a variant with the DSL, checks its IR, compiles its kernels with
// NVRTC and, on a GPU, runs them and compares the output with the CPU reference. Without a GPU it compiles the
// kernels for --arch (NVRTC needs no GPU), says that it skipped running them, and exits 0.
//
//   installed_cpp_example [--arch sm_80] [--tokens 256]
#include <sage/numerics/Quantizers.h>
#include <sage/reference/Metrics.h>
#include <sage/reference/Reference.h>
#include <sage/sage.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

using namespace sage;

namespace {

constexpr int64_t kHeads = 2, kDim = 64;

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Runs the variant on the GPU and returns O (f16, read back as double).
std::vector<double> runOnGpu(const ir::Program &program, const reference::HostTensor &q, const reference::HostTensor &k,
                             const reference::HostTensor &v) {
  const runtime::CudaDriver &driver = runtime::CudaDriver::instance();
  runtime::AttentionRunnerOptions options;
  options.ir_fingerprint = program.fingerprint();
  runtime::AttentionRunner runner(program.variant(), options); // the device's arch: AOT, cache or NVRTC
  std::printf("%s\n", runner.describe().c_str());

  std::vector<runtime::driver::DevicePointer> buffers;
  auto upload = [&](const reference::HostTensor &tensor) {
    std::vector<uint16_t> bits(tensor.values().size());
    for (size_t i = 0; i < bits.size(); ++i)
      bits[i] = numerics::floatToHalfBits(tensor.values()[i]);
    buffers.push_back(driver.allocate(bits.size() * 2));
    driver.copyToDevice(buffers.back(), bits.data(), bits.size() * 2);
    return reinterpret_cast<void *>(buffers.back());
  };
  const int64_t tokens = q.tokens();
  const schedules::ProblemShape shape{1, kHeads, kHeads, tokens, tokens, kDim};
  const SageTensorStrides strides{kHeads * tokens * kDim, tokens * kDim, kDim}; // HND, contiguous
  runtime::AttentionTensors tensors;
  tensors.q = upload(q);
  tensors.k = upload(k);
  tensors.v = upload(v);
  tensors.q_strides = tensors.k_strides = tensors.v_strides = tensors.o_strides = strides;
  const size_t o_bytes = q.values().size() * 2, workspace_bytes = runner.workspaceBytes(shape);
  buffers.push_back(driver.allocate(o_bytes));
  tensors.o = reinterpret_cast<void *>(buffers.back());
  buffers.push_back(driver.allocate(workspace_bytes));
  runner.run(shape, tensors, reinterpret_cast<void *>(buffers.back()), workspace_bytes, /*stream=*/nullptr);
  driver.synchronizeContext();

  std::vector<uint16_t> o_bits(q.values().size());
  driver.copyToHost(o_bits.data(), reinterpret_cast<runtime::driver::DevicePointer>(tensors.o), o_bytes);
  for (runtime::driver::DevicePointer buffer : buffers)
    driver.free(buffer);
  std::vector<double> output(o_bits.size());
  for (size_t i = 0; i < o_bits.size(); ++i)
    output[i] = numerics::halfBitsToFloat(o_bits[i]);
  return output;
}

int run(schedules::GpuArch compile_arch, int64_t tokens) {
  // 1. The variant, with the DSL: SageAttention's INT8 Q.K^T per block with K smoothing, f16 P.V accumulated in
  //    f32, causal.
  using namespace sage::dsl;
  ir::Program program =
      attention("installed_app").head_dim(kDim).qk(int8(per_block).smooth_k()).pv(f16(accum::f32)).mask(causal).build();

  // 2. Its IR: printed, parsed back and verified, the same program (the fingerprint keys the kernel cache).
  const std::string text = program.print();
  std::printf("%s", text.c_str());
  const ir::Program parsed = ir::Program::parse(text, "printed");
  if (parsed.fingerprint() != program.fingerprint())
    throw std::runtime_error("the printed IR does not parse back to the same program");
  const AttentionVariant variant = program.variant();

  const runtime::CudaDriver &driver = runtime::CudaDriver::instance();
  if (!driver.available()) {
    // 3. No GPU: generate the kernels' CUDA C++ and compile it with NVRTC for --arch, into the kernel cache
    //    ($SAGEGEN_CACHE_DIR), as `sagegen cache warm` does.
    runtime::AttentionRunnerOptions options;
    options.ir_fingerprint = program.fingerprint();
    options.arch = compile_arch;
    const auto start = std::chrono::steady_clock::now();
    runtime::AttentionRunner::compileKernels(variant, options);
    std::printf("compiled the kernels for %s with NVRTC in %.1f s\n",
                std::string(schedules::archName(compile_arch)).c_str(), secondsSince(start));
    std::printf("installed_cpp_example: OK, skipped running: no GPU (%s)\n", driver.status().reason.c_str());
    return 0;
  }

  // 4. On the GPU, against the CPU reference of the same variant (bit-exact quantizers, double precision) and
  //    against exact attention.
  using reference::Layout;
  using reference::StorageType;
  const auto q = reference::randomTensor(1, kHeads, tokens, kDim, StorageType::f16, Layout::hnd, {1});
  const auto k = reference::randomTensor(1, kHeads, tokens, kDim, StorageType::f16, Layout::hnd, {2, 0.0, 1.0, 4.0});
  const auto v = reference::randomTensor(1, kHeads, tokens, kDim, StorageType::f16, Layout::hnd, {3});
  const std::vector<double> output = runOnGpu(program, q, k, v);
  const auto vs_reference = reference::compareOutputs(reference::runReference(variant, q, k, v).output, output);
  const auto vs_exact = reference::compareOutputs(reference::exactAttention(q, k, v, /*causal=*/true).output, output);
  std::printf("vs CPU reference: cos %.6f rel-L1 %.4f; vs exact attention: cos %.6f rel-L1 %.4f\n",
              vs_reference.cosine_similarity, vs_reference.relative_l1, vs_exact.cosine_similarity,
              vs_exact.relative_l1);
  const bool ok = vs_reference.cosine_similarity >= 0.9999 && vs_exact.cosine_similarity >= 0.999;
  std::printf("installed_cpp_example: %s\n", ok ? "OK" : "MISMATCH");
  return ok ? 0 : 1;
}

} // namespace

int main(int argc, char **argv) {
  try {
    schedules::GpuArch arch = schedules::GpuArch::sm80;
    int64_t tokens = 256;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string_view flag = argv[i];
      if (flag == "--arch" && schedules::parseArch(argv[i + 1]))
        arch = *schedules::parseArch(argv[i + 1]);
      else if (flag == "--tokens" && std::atoll(argv[i + 1]) > 0)
        tokens = std::atoll(argv[i + 1]);
      else
        throw std::invalid_argument("usage: installed_cpp_example [--arch sm_80] [--tokens 256]");
    }
    if (argc % 2 == 0)
      throw std::invalid_argument("usage: installed_cpp_example [--arch sm_80] [--tokens 256]");
    return run(arch, tokens);
  } catch (const std::exception &error) {
    std::fprintf(stderr, "installed_cpp_example: %s\n", error.what());
    return 1;
  }
}
