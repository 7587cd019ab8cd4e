// AttentionRunner::compileKernels: a variant's kernels compiled into the cache without a GPU, as `sagegen tune`
// compiles its candidates on CPU threads.
#include "sage/runtime/AttentionRunner.h"

#include "sage/dsl/Presets.h"
#include "sage/runtime/NvrtcCompiler.h"

#include <doctest/doctest.h>

#include <stdexcept>
#include <thread>
#include <vector>

using namespace sage;

TEST_CASE("kernels compile into the cache without a GPU, from several threads") {
  const ir::Program program = dsl::preset("sage-b", 64)->build();
  runtime::KernelCache cache(runtime::KernelCacheOptions{{}, true, {}});
  runtime::AttentionRunnerOptions options;
  options.arch = schedules::GpuArch::sm80;
  options.ir_fingerprint = program.fingerprint();
  options.cache = &cache;
  std::vector<std::thread> threads;
  for (int stages : {2, 3})
    threads.emplace_back([&, stages] {
      runtime::AttentionRunnerOptions mine = options;
      mine.tunables = schedules::Tunables{128, 64, 4, stages};
      runtime::AttentionRunner::compileKernels(program.variant(), mine);
    });
  for (std::thread &thread : threads)
    thread.join();
  const runtime::CacheStats built = cache.stats();
  CHECK(built.builds >= 3); // the prologue once (shared), an attention kernel per stage count
  options.tunables = schedules::Tunables{128, 64, 4, 3};
  runtime::AttentionRunner::compileKernels(program.variant(), options); // a rerun: every kernel from memory
  CHECK(cache.stats().builds == built.builds);
  CHECK(cache.stats().memory_hits > built.memory_hits);
}

TEST_CASE("compiling without a GPU needs the arch, and valid tunables") {
  const AttentionVariant variant = dsl::preset("sage-b", 64)->describe();
  runtime::AttentionRunnerOptions options;
  CHECK_THROWS_WITH_AS(runtime::AttentionRunner::compileKernels(variant, options),
                       doctest::Contains("options.arch must be set"), std::invalid_argument);
  options.arch = schedules::GpuArch::sm80;
  options.tunables = schedules::Tunables{128, 128, 4, 3};
  CHECK_THROWS_WITH_AS(runtime::AttentionRunner::compileKernels(variant, options),
                       doctest::Contains("tunables.block_kv"), std::invalid_argument);
}
