// Kernels on the GPU against the CPU reference of the same variant (same quantizers), and against exact
// attention. Skipped, with a message, where no GPU is present. Prints one line per case for the GPU check.
#include "../support/SkipWithoutGpu.h"
#include "GpuAttentionRun.h"
#include "sage/dsl/Presets.h"
#include "sage/numerics/Quantizers.h"
#include "sage/reference/Metrics.h"
#include "sage/reference/Reference.h"
#include "sage/runtime/AotManifest.h"
#include "sage/runtime/AttentionKernelSet.h"
#include "sage/runtime/AttentionRunner.h"
#include "sage/runtime/CudaDriver.h"
#include "sage/runtime/DeviceArch.h"
#include "sage/runtime/LoadedKernel.h"
#include "sage/runtime/NvrtcCompiler.h"
#include "sage/runtime/Sha256.h"
#include "sage/schedules/GpuArch.h"
#include "sage/schedules/ScheduleRegistry.h"
#include "sage/schedules/Sm90Schedule.h"

#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <unistd.h>
#include <vector>

using namespace sage;
using namespace sage::reference;
using namespace sage::test;

namespace {

bool skipWithoutGpu() { return sage::test::skipWithoutGpu("gpu_attention_test"); }

struct Case {
  const char *preset;
  int head_dim;
  bool causal;
  StorageType storage;
  Layout layout;
  int64_t heads_q, heads_kv, tokens_q, tokens_kv;
  double k_bias;
  double max_rel_l1_vs_reference; // how far the kernel may sit from the reference of the same variant
  double min_cosine_vs_reference;
  double max_lse_error; // largest |LSE - reference LSE| over the rows; < 0: not checked
};

// Returns the runner's describe(). With `aot_directory`, the runner looks there first; with `schedule`, that
// schedule runs the variant (else the best one for the arch).
std::string runCase(const Case &c, const std::filesystem::path &aot_directory = {}, const std::string &schedule = {}) {
  const MaskKind mask = c.causal ? MaskKind::causal : MaskKind::none;
  ir::Program program = dsl::preset(c.preset, c.head_dim, mask)->lse().build();
  const AttentionVariant variant = program.variant();
  const HostTensor q = randomTensor(1, c.heads_q, c.tokens_q, c.head_dim, c.storage, c.layout, {101});
  const HostTensor k = randomTensor(1, c.heads_kv, c.tokens_kv, c.head_dim, c.storage, c.layout, {102, 0, 1, c.k_bias});
  const HostTensor v = randomTensor(1, c.heads_kv, c.tokens_kv, c.head_dim, c.storage, c.layout, {103});
  const AttentionResult expected = runReference(variant, q, k, v);
  const AttentionResult exact = exactAttention(q, k, v, c.causal);
  const GpuRun run = runOnGpu(program, q, k, v, aot_directory, schedule);
  const std::vector<double> &output = run.output;
  const std::vector<float> &lse = run.lse;
  double lse_error = 0.0;
  for (size_t i = 0; i < lse.size(); ++i)
    if (std::isfinite(expected.lse[i]))
      lse_error = std::max(lse_error, std::fabs(lse[i] - expected.lse[i]));

  const AccuracyMetrics vs_reference = compareOutputs(expected.output, output);
  const AccuracyMetrics vs_exact = compareOutputs(exact.output, output);
  const AccuracyMetrics reference_vs_exact = compareOutputs(exact.output, expected.output);
  std::printf("gpu_attention_test: %-14s %-9s d%-3d %-6s %-4s %s h%lld/%lld n%lld/%lld bias%-3g | vs reference cos "
              "%.6f rel-L1 %.4f | vs exact cos %.6f rel-L1 %.4f (reference %.4f) | lse err %.2e\n",
              schedule.empty() ? "best" : schedule.c_str(), c.preset, c.head_dim, c.causal ? "causal" : "full",
              nameOf(c.storage).data(), nameOf(c.layout).data(), static_cast<long long>(c.heads_q),
              static_cast<long long>(c.heads_kv), static_cast<long long>(c.tokens_q),
              static_cast<long long>(c.tokens_kv), c.k_bias, vs_reference.cosine_similarity, vs_reference.relative_l1,
              vs_exact.cosine_similarity, vs_exact.relative_l1, reference_vs_exact.relative_l1, lse_error);
  CHECK(vs_reference.relative_l1 <= c.max_rel_l1_vs_reference);
  CHECK(vs_reference.cosine_similarity >= c.min_cosine_vs_reference);
  // The kernel is no less accurate than its own reference, up to the rounding of O (bf16 O: ~1.4e-3 rel-L1).
  CHECK(vs_exact.relative_l1 <= 1.25 * reference_vs_exact.relative_l1 + 0.004);
  if (c.max_lse_error >= 0.0)
    CHECK(lse_error <= c.max_lse_error);
  return run.description;
}

// What `sagegen emit --format cubin` writes, for one variant on this device's arch: cubins and a manifest.
void writeAotDirectory(const std::filesystem::path &directory, const Case &c) {
  const schedules::GpuArch arch = runtime::currentDeviceArch();
  ir::Program program = dsl::preset(c.preset, c.head_dim, c.causal ? MaskKind::causal : MaskKind::none)->lse().build();
  runtime::AttentionKernelRequest request;
  request.input = c.storage == StorageType::bf16 ? schedules::InputType::bf16 : schedules::InputType::f16;
  request.arch = arch;
  request.ir_fingerprint = program.fingerprint();
  runtime::AttentionKernelSet set = runtime::generateAttentionKernels(program.variant(), request);
  runtime::AotManifest manifest;
  manifest.key_format_version = runtime::kKernelKeyFormatVersion;
  manifest.sagegen_version = runtime::sagegenVersion();
  manifest.nvrtc_version = runtime::nvrtcVersion();
  std::filesystem::create_directories(directory);
  for (const runtime::GeneratedKernel &kernel : set.kernels) {
    runtime::CompileRequest compile;
    compile.key = kernel.name;
    compile.source = runtime::selfContainedSource(kernel);
    compile.options.arch = kernel.key.arch;
    const runtime::ByteBuffer cubin = runtime::NvrtcCompiler().compileCubin(compile).image;
    runtime::AotKernelEntry entry;
    entry.key_digest = kernel.key.digest();
    entry.key_text = kernel.key.text();
    entry.variant = entry.preset = c.preset;
    entry.head_dim = c.head_dim;
    entry.causal = c.causal;
    entry.lse = true;
    entry.role = std::string(runtime::nameOf(kernel.role));
    entry.name = kernel.name;
    entry.schedule = kernel.key.schedule;
    entry.tunables = kernel.key.tunables;
    entry.arch = kernel.key.arch;
    entry.input = std::string(schedules::nameOf(request.input));
    entry.entry_point = kernel.entry_point;
    entry.source_sha256 = runtime::sha256Hex(compile.source);
    // The names `sagegen emit` derives from the entry (the manifest refuses any other)
    entry.source_file = runtime::aotSourceFileName(entry.entry_point, entry.source_sha256);
    entry.cubin_file = runtime::aotImageFileName(entry.entry_point, entry.source_sha256, entry.arch, "cubin");
    entry.cubin_sha256 = runtime::sha256Hex(cubin);
    entry.block = {int(kernel.block[0]), int(kernel.block[1]), int(kernel.block[2])};
    entry.grid_rule = kernel.grid_rule;
    entry.dynamic_shared_bytes = kernel.dynamic_shared_bytes;
    std::ofstream(directory / entry.source_file, std::ios::binary) << compile.source;
    std::ofstream(directory / entry.cubin_file, std::ios::binary)
        .write(reinterpret_cast<const char *>(cubin.data()), static_cast<std::streamsize>(cubin.size()));
    manifest.kernels.push_back(std::move(entry));
  }
  std::ofstream(directory / "manifest.json", std::ios::binary) << runtime::writeAotManifest(manifest);
}

size_t occurrences(const std::string &text, const std::string &word) {
  size_t count = 0;
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1))
    ++count;
  return count;
}

} // namespace

TEST_CASE("kernels match the CPU reference of their variant") {
  if (skipWithoutGpu())
    return;
  // Bounds vs the reference: the f16 accumulator and P rounding see different summation orders on the GPU
  // (and ex2.approx); 8-bit P moves a few codes across rounding boundaries. Same quantizers as the reference, so the
  // LSE differs by f32 sums, ex2.approx and the max-finding order only (measured below 1e-5 on an H100); the
  // K-smoothing correction reads the caller's Q, so a K bias adds nothing: bound 0.01.
  //
  // exact: the reference is f64 attention, so "reference error" is 0 and the bound is the GPU's own rounding,
  // derived here (N(0,1) data, fairly flat softmax over a few hundred tokens). Q.K^T multiplies the f16/bf16
  // inputs exactly with f32 accumulation (~1e-6 relative), and ex2.approx is within 2 f32 ulp: negligible. P is
  // rounded to f16 (relative error uniform in +-2^-11 of its binade: RMS ~2e-4) and, the errors of different
  // tokens being independent, O inherits about that relative error. O is then rounded to the output type: a mean
  // relative error of ulp / 4 (ulp / |x| averages 2^-10 x 0.72 for f16, 2^-7 x 0.72 for bf16), so ~1.8e-4 (f16)
  // and ~1.4e-3 (bf16). A bf16 V is converted to f16 exactly (7 mantissa bits fit in 10). Expected rel-L1:
  // ~4e-4 (f16), ~1.6e-3 (bf16); bounds 5x and 3x that. 1 - cos is about half the squared RMS relative
  // error: ~1e-7 (f16) and ~3e-6 (bf16) against bounds of 1e-5 and 1e-4. The LSE is m + log2(l) in f32 from f32
  // S: ~1e-5 absolute at |LSE| ~ 10, bounded by 1e-3; with no smoothing a K bias changes nothing there.
  const Case cases[] = {
      {"sage-b", 128, false, StorageType::f16, Layout::hnd, 2, 2, 300, 300, 0.0, 0.01, 0.999, 0.01},
      {"sage-b", 128, true, StorageType::f16, Layout::hnd, 2, 1, 200, 333, 0.0, 0.01, 0.999, 0.01},
      {"sage-b", 64, false, StorageType::bf16, Layout::nhd, 4, 2, 256, 256, 0.0, 0.015, 0.999, 0.01},
      {"sage-b", 128, false, StorageType::f16, Layout::hnd, 2, 2, 512, 512, 20.0, 0.01, 0.999, 0.01},
      {"sage-t", 64, true, StorageType::f16, Layout::nhd, 4, 2, 384, 384, 0.0, 0.01, 0.999, 0.01},
      {"sage-t", 128, false, StorageType::f16, Layout::hnd, 2, 2, 190, 450, 0.0, 0.01, 0.999, 0.01},
      {"sage-vb", 128, false, StorageType::f16, Layout::hnd, 2, 2, 300, 300, 0.0, 0.02, 0.999, 0.01},
      {"sage-vt", 64, true, StorageType::f16, Layout::hnd, 2, 2, 256, 256, 0.0, 0.02, 0.999, 0.01},
      {"sage2-fp8", 128, false, StorageType::f16, Layout::hnd, 2, 2, 300, 300, 0.0, 0.04, 0.999, 0.01},
      {"sage2-fp8", 64, true, StorageType::bf16, Layout::hnd, 2, 1, 256, 256, 0.0, 0.04, 0.999, 0.01},
      // INT4 (decoded to int8 codes) with Q smoothing's delta_s: GQA, tails, causal, a K bias, both inputs.
      {"sage2-int4", 128, false, StorageType::f16, Layout::hnd, 2, 2, 300, 300, 0.0, 0.04, 0.999, 0.01},
      {"sage2-int4", 128, true, StorageType::f16, Layout::nhd, 4, 2, 200, 333, 8.0, 0.04, 0.999, 0.01},
      {"sage2-int4", 64, false, StorageType::bf16, Layout::hnd, 2, 1, 190, 450, 0.0, 0.04, 0.999, 0.01},
      {"sage2-int4-no-smooth-q", 128, false, StorageType::f16, Layout::hnd, 2, 2, 300, 300, 0.0, 0.04, 0.999, 0.01},
      {"sage2-int4-no-smooth-q", 64, true, StorageType::bf16, Layout::nhd, 2, 1, 256, 256, 0.0, 0.04, 0.999, 0.01},
      // FP4 by emulation (sm80 schedule: codes x microscales decoded to f16/bf16, P microscaled in registers): the
      // prologue's codes are bit-exact with the reference's, so the differences are f32 sums, ex2.approx and the P
      // codes that those move across a rounding boundary (as for 8-bit P): the 8-bit presets' bound.
      {"sage3-fp4", 128, false, StorageType::f16, Layout::hnd, 2, 2, 300, 300, 0.0, 0.04, 0.999, 0.01},
      {"sage3-fp4", 128, true, StorageType::f16, Layout::nhd, 4, 2, 200, 333, 8.0, 0.04, 0.999, 0.01},
      {"sage3-fp4", 64, false, StorageType::bf16, Layout::hnd, 2, 1, 190, 450, 0.0, 0.04, 0.999, 0.01},
      {"sage3-fp4", 64, true, StorageType::f16, Layout::hnd, 2, 2, 256, 256, 0.0, 0.04, 0.999, 0.01},
      {"sage3-fp4-direct-p", 128, true, StorageType::f16, Layout::hnd, 2, 2, 300, 300, 0.0, 0.04, 0.999, 0.01},
      {"sage3-fp4-direct-p", 64, false, StorageType::bf16, Layout::nhd, 2, 1, 256, 256, 0.0, 0.04, 0.999, 0.01},
      {"sage3-mxfp4", 128, false, StorageType::f16, Layout::hnd, 2, 2, 300, 300, 0.0, 0.04, 0.999, 0.01},
      {"sage3-mxfp4", 64, true, StorageType::bf16, Layout::nhd, 4, 2, 200, 333, 0.0, 0.04, 0.999, 0.01},
      {"exact", 64, false, StorageType::f16, Layout::hnd, 2, 2, 300, 300, 0.0, 0.002, 0.99999, 1e-3},
      {"exact", 64, true, StorageType::f16, Layout::nhd, 4, 2, 256, 384, 0.0, 0.002, 0.99999, 1e-3},
      {"exact", 128, false, StorageType::f16, Layout::nhd, 2, 1, 190, 450, 8.0, 0.002, 0.99999, 1e-3},
      {"exact", 128, true, StorageType::f16, Layout::hnd, 2, 2, 333, 333, 0.0, 0.002, 0.99999, 1e-3},
      {"exact", 64, false, StorageType::bf16, Layout::nhd, 4, 2, 256, 256, 0.0, 0.005, 0.9999, 1e-3},
      {"exact", 64, true, StorageType::bf16, Layout::hnd, 2, 2, 300, 300, 0.0, 0.005, 0.9999, 1e-3},
      {"exact", 128, false, StorageType::bf16, Layout::hnd, 2, 2, 300, 300, 0.0, 0.005, 0.9999, 1e-3},
      {"exact", 128, true, StorageType::bf16, Layout::nhd, 2, 1, 200, 333, 0.0, 0.005, 0.9999, 1e-3},
      // Issue 28, head dims 192 and 256 (sm90: P.V over column slices of V, an outer sum folded slice by slice with
      // inline loads, int8 rows of 192 bytes in 64-byte chunks; sm80: its own tiles): the bounds of the rows above.
      {"sage-b", 256, true, StorageType::f16, Layout::hnd, 2, 1, 200, 333, 8.0, 0.01, 0.999, 0.01},
      {"sage-b", 256, false, StorageType::bf16, Layout::nhd, 2, 2, 300, 300, 0.0, 0.015, 0.999, 0.01},
      {"sage-b", 192, true, StorageType::f16, Layout::nhd, 4, 2, 256, 384, 8.0, 0.01, 0.999, 0.01},
      {"sage-b", 192, false, StorageType::bf16, Layout::hnd, 2, 2, 190, 450, 0.0, 0.015, 0.999, 0.01},
      {"sage2-fp8", 256, false, StorageType::f16, Layout::hnd, 2, 2, 300, 300, 8.0, 0.04, 0.999, 0.01},
      {"sage2-fp8", 256, true, StorageType::bf16, Layout::hnd, 2, 1, 200, 333, 0.0, 0.04, 0.999, 0.01},
      {"sage2-fp8", 192, false, StorageType::bf16, Layout::nhd, 4, 2, 190, 450, 8.0, 0.04, 0.999, 0.01},
      {"sage2-fp8", 192, true, StorageType::f16, Layout::hnd, 2, 2, 300, 300, 0.0, 0.04, 0.999, 0.01},
      {"sage-vb", 256, true, StorageType::f16, Layout::hnd, 2, 2, 300, 300, 8.0, 0.02, 0.999, 0.01},
      {"sage-vb", 256, false, StorageType::bf16, Layout::nhd, 2, 1, 256, 256, 0.0, 0.02, 0.999, 0.01},
      {"sage-vb", 192, true, StorageType::bf16, Layout::hnd, 2, 1, 200, 333, 8.0, 0.02, 0.999, 0.01},
      {"sage-t", 256, false, StorageType::f16, Layout::hnd, 2, 2, 190, 450, 8.0, 0.01, 0.999, 0.01},
      {"exact", 256, true, StorageType::f16, Layout::hnd, 2, 2, 300, 300, 0.0, 0.002, 0.99999, 1e-3},
      {"exact", 192, false, StorageType::bf16, Layout::nhd, 2, 1, 190, 450, 0.0, 0.005, 0.9999, 1e-3},
  };
  // Every schedule that runs the case on this GPU (on an H100: sm90.wgmma_tma and sm80.mma_sync), each against the
  // same reference and bounds. SAGEGEN_GPU_ONE_CASE_PER_PRESET (tools/gpu-check --sanitize): the first, small case of
  // each preset only, so that compute-sanitizer's memcheck, racecheck and initcheck see every kernel variant in bounded
  // time. SAGEGEN_GPU_MIN_HEAD_DIM=D: the cases of head dims >= D only (the sanitizers over the wide kernels).
  const bool one_case_per_preset = std::getenv("SAGEGEN_GPU_ONE_CASE_PER_PRESET") != nullptr;
  const char *min_head_dim = std::getenv("SAGEGEN_GPU_MIN_HEAD_DIM");
  std::set<std::string> presets_run;
  const schedules::GpuArch arch = runtime::currentDeviceArch();
  for (const Case &c : cases) {
    if (min_head_dim != nullptr && c.head_dim < std::atoi(min_head_dim))
      continue;
    if (one_case_per_preset && !presets_run.insert(c.preset).second)
      continue;
    for (const schedules::Schedule *schedule : schedules::allSchedules()) {
      const ir::Program program =
          dsl::preset(c.preset, c.head_dim, c.causal ? MaskKind::causal : MaskKind::none)->lse().build();
      const schedules::InputType input =
          c.storage == StorageType::bf16 ? schedules::InputType::bf16 : schedules::InputType::f16;
      if (!schedule->supports(program.variant(), arch, input))
        continue;
      const std::string name =
          std::string(c.preset) + (c.causal ? " causal" : "") + " on " + std::string(schedule->name());
      CAPTURE(name);
      CAPTURE(c.head_dim);
      runCase(c, {}, std::string(schedule->name()));
    }
  }
}

// Issue 11's accuracy table on the GPU: one head of N(0,1) Q, K, V, N = 4096, d = 128, against exact attention
// (f64 on the CPU), each kernel beside the CPU reference of its own algorithm. Every listed preset that a schedule
// runs on this GPU is measured and printed; the ones no schedule runs yet are printed as such.
//
// Why cos >= 0.999 is not asserted for the 4-bit presets: on iid N(0,1) data attention is nearly uniform, O is an
// average over ~N/e keys, and a relative error e of S (per-thread INT4 codes: e ~ 0.17; FP4 likewise) perturbs each
// weight by ~e, which goes almost whole into O's relative error (measured on an H100 on 2026-11-24: the kernel and the
// CPU reference of the same quantizers agree to cos 1.000000 and both give cos 0.979 / rel-L1 0.206 for sage2-int4).
// The assertions are therefore: the kernel's error against exact attention is the algorithm's (the reference's), and
// the paper's orderings hold (smoothing, two-level P, NVFP4 over MXFP4).
TEST_CASE("accuracy against exact attention on N(0,1), N = 4096, d = 128 (issue 11's table)") {
  if (skipWithoutGpu())
    return;
  constexpr int64_t kTokens = 4096, kDim = 128;
  const HostTensor q = randomTensor(1, 1, kTokens, kDim, StorageType::f16, Layout::hnd, {211});
  const HostTensor k = randomTensor(1, 1, kTokens, kDim, StorageType::f16, Layout::hnd, {212});
  const HostTensor v = randomTensor(1, 1, kTokens, kDim, StorageType::f16, Layout::hnd, {213});
  const AttentionResult exact = exactAttention(q, k, v, false);
  const schedules::GpuArch arch = runtime::currentDeviceArch();
  std::map<std::string, AccuracyMetrics> measured;
  for (const char *name :
       {"sage3-fp4", "sage3-fp4-direct-p", "sage3-mxfp4", "sage2-int4", "sage2-int4-no-smooth-q", "sage2-fp8"}) {
    const ir::Program program = dsl::preset(name, kDim)->build();
    bool supported = false;
    for (const schedules::ScheduleVerdict &verdict :
         schedules::scheduleVerdicts(program.variant(), arch, schedules::InputType::f16))
      supported = supported || static_cast<bool>(verdict.support);
    if (!supported) {
      std::printf("gpu_attention_test: accuracy %-22s N%lld d%lld: no schedule runs it on %s\n", name,
                  static_cast<long long>(kTokens), static_cast<long long>(kDim), schedules::archName(arch).data());
      continue;
    }
    const GpuRun run = runOnGpu(program, q, k, v);
    const AccuracyMetrics metrics = compareOutputs(exact.output, run.output);
    const AccuracyMetrics algorithm = compareOutputs(exact.output, runReference(program.variant(), q, k, v).output);
    measured[name] = metrics;
    std::printf("gpu_attention_test: accuracy %-22s N%lld d%lld vs exact: cos %.6f rel-L1 %.4f; CPU reference of "
                "the same algorithm cos %.6f rel-L1 %.4f (%s)\n",
                name, static_cast<long long>(kTokens), static_cast<long long>(kDim), metrics.cosine_similarity,
                metrics.relative_l1, algorithm.cosine_similarity, algorithm.relative_l1, run.description.c_str());
    CHECK(std::abs(metrics.relative_l1 - algorithm.relative_l1) <= 0.02 * algorithm.relative_l1 + 1e-3);
    CHECK(metrics.cosine_similarity >= algorithm.cosine_similarity - 1e-3);
  }
  if (measured.count("sage2-int4") && measured.count("sage2-int4-no-smooth-q")) {
    // iid N(0,1) Q has block means near 0, so smoothing gains little there; Q whose tokens share a per-channel bias
    // (the outliers SageAttention2 smooths away; bias 4, as the CPU accuracy test) shows the effect plainly.
    const HostTensor biased_q = randomTensor(1, 1, kTokens, kDim, StorageType::f16, Layout::hnd, {214, 0.0, 1.0, 4.0});
    const AttentionResult biased_exact = exactAttention(biased_q, k, v, false);
    std::map<std::string, AccuracyMetrics> biased;
    for (const char *name : {"sage2-int4", "sage2-int4-no-smooth-q"}) {
      biased[name] =
          compareOutputs(biased_exact.output, runOnGpu(dsl::preset(name, kDim)->build(), biased_q, k, v).output);
      std::printf("gpu_attention_test: accuracy %-22s N%lld d%lld, Q with channel bias 4, vs exact: cos %.6f rel-L1 "
                  "%.4f\n",
                  name, static_cast<long long>(kTokens), static_cast<long long>(kDim), biased[name].cosine_similarity,
                  biased[name].relative_l1);
    }
    CHECK(biased["sage2-int4"].relative_l1 < 0.8 * biased["sage2-int4-no-smooth-q"].relative_l1);
    CHECK(biased["sage2-int4"].cosine_similarity > biased["sage2-int4-no-smooth-q"].cosine_similarity);
  }
  if (measured.count("sage3-fp4") && measured.count("sage3-fp4-direct-p")) {
    CHECK(measured["sage3-fp4"].relative_l1 < measured["sage3-fp4-direct-p"].relative_l1);
    if (measured.count("sage3-mxfp4"))
      CHECK(measured["sage3-fp4-direct-p"].relative_l1 < measured["sage3-mxfp4"].relative_l1);
  }
}

// A block mask [batch, heads_q, q_blocks, kv_blocks] whose rows take turns: none kept (O = 0, LSE = -inf), all kept,
// about a third kept at random, and block-causal (KV blocks that start at or before the Q block's last row).
BlockMask mixedBlockMask(const AttentionVariant &variant, int64_t batch, int64_t heads_q, int64_t tokens_q,
                         int64_t tokens_kv, unsigned seed) {
  BlockMask mask;
  mask.q_blocks = (tokens_q + variant.block_q - 1) / variant.block_q;
  mask.kv_blocks = (tokens_kv + variant.block_kv - 1) / variant.block_kv;
  mask.keep.resize(static_cast<size_t>(batch * heads_q * mask.q_blocks * mask.kv_blocks));
  std::mt19937 random(seed);
  std::bernoulli_distribution third(1.0 / 3.0);
  for (int64_t row = 0; row < batch * heads_q * mask.q_blocks; ++row) {
    const int64_t q_block = row % mask.q_blocks;
    for (int64_t j = 0; j < mask.kv_blocks; ++j) {
      bool keep = false;
      switch ((row + seed) % 4) {
      case 0:
        keep = false;
        break;
      case 1:
        keep = true;
        break;
      case 2:
        keep = third(random);
        break;
      default:
        keep = j * variant.block_kv <= (q_block + 1) * variant.block_q - 1;
      }
      mask.keep[static_cast<size_t>(row * mask.kv_blocks + j)] = keep ? 1 : 0;
    }
  }
  return mask;
}

struct BlockSparseCase {
  const char *preset;
  bool sla_sparse_part; // the SLA preset's sparse part (64 x 64 blocks) instead of the preset with a block mask
  int head_dim;
  StorageType storage;
  Layout layout;
  int64_t batch, heads_q, heads_kv, tokens_q, tokens_kv;
  double max_rel_l1_vs_reference;
};

// Block-sparse variants on every schedule that runs them (on an H100: sm90.wgmma_tma and sm80.mma_sync) against the
// CPU reference with the same mask: the mixed mask above and no mask (every block).
TEST_CASE("block-sparse masks on every schedule: empty, full, random and block-causal rows") {
  if (skipWithoutGpu())
    return;
  // Bounds: those of the dense cases of the same presets (the same kernels, fewer blocks per row).
  const BlockSparseCase cases[] = {
      {"sla-f16", true, 128, StorageType::f16, Layout::hnd, 2, 4, 2, 300, 333, 0.002},
      {"sla-f16", true, 64, StorageType::f16, Layout::nhd, 1, 2, 2, 130, 1000, 0.002},
      {"sla-int8", true, 128, StorageType::f16, Layout::hnd, 2, 2, 1, 257, 257, 0.01},
      {"sage-b", false, 128, StorageType::f16, Layout::hnd, 2, 2, 2, 300, 450, 0.01},
      {"sage-vb", false, 64, StorageType::bf16, Layout::nhd, 2, 4, 2, 256, 190, 0.02},
      {"sage2-fp8", false, 128, StorageType::f16, Layout::hnd, 1, 4, 2, 384, 700, 0.04},
      {"exact", false, 128, StorageType::bf16, Layout::hnd, 2, 2, 1, 200, 333, 0.005},
  };
  const schedules::GpuArch arch = runtime::currentDeviceArch();
  std::set<std::string> schedules_run;
  unsigned seed = 0;
  for (const BlockSparseCase &c : cases) {
    AttentionVariant variant;
    if (c.sla_sparse_part) {
      variant = dsl::preset(c.preset, c.head_dim)->describe();
      variant.sla = SlaSpec{};
    } else {
      variant = dsl::preset(c.preset, c.head_dim, MaskKind::block_sparse)->lse().describe();
    }
    variant.epilogue.write_lse = true; // as the builder's lse() sets it (the SLA presets' sparse parts have none)
    variant.epilogue.lse_smoothing_correction = variant.smooth_k != SmoothScope::none;
    const ir::Program program = dsl::emitProgram(variant);
    const HostTensor q = randomTensor(c.batch, c.heads_q, c.tokens_q, c.head_dim, c.storage, c.layout, {201});
    const HostTensor k = randomTensor(c.batch, c.heads_kv, c.tokens_kv, c.head_dim, c.storage, c.layout, {202});
    const HostTensor v = randomTensor(c.batch, c.heads_kv, c.tokens_kv, c.head_dim, c.storage, c.layout, {203});
    const BlockMask mixed = mixedBlockMask(variant, c.batch, c.heads_q, c.tokens_q, c.tokens_kv, ++seed);
    BlockMask every = mixed;
    std::fill(every.keep.begin(), every.keep.end(), uint8_t{1});
    const schedules::InputType input =
        c.storage == StorageType::bf16 ? schedules::InputType::bf16 : schedules::InputType::f16;
    for (const schedules::Schedule *schedule : schedules::allSchedules()) {
      if (!schedule->supports(variant, arch, input))
        continue;
      schedules_run.insert(std::string(schedule->name()));
      for (const bool with_mask : {true, false}) {
        const std::string name = std::string(c.preset) + (c.sla_sparse_part ? " (SLA sparse part)" : "") + " d" +
                                 std::to_string(c.head_dim) + (with_mask ? " mixed mask" : " no mask") + " on " +
                                 std::string(schedule->name());
        CAPTURE(name);
        const AttentionResult expected = runReference(variant, q, k, v, with_mask ? &mixed : &every);
        const GpuRun run = runOnGpu(program, q, k, v, {}, std::string(schedule->name()), with_mask ? &mixed : nullptr);
        const AccuracyMetrics metrics = compareOutputs(expected.output, run.output);
        double lse_error = 0.0;
        int64_t empty_rows = 0, empty_rows_wrong = 0;
        for (size_t row = 0; row < run.lse.size(); ++row) {
          if (std::isfinite(expected.lse[row])) {
            lse_error = std::max(lse_error, std::fabs(run.lse[row] - expected.lse[row]));
            continue;
          }
          ++empty_rows; // no kept block: the reference writes zeros and -inf
          bool wrong = !(std::isinf(run.lse[row]) && run.lse[row] < 0.0f);
          for (int64_t d = 0; d < c.head_dim; ++d)
            wrong = wrong || run.output[row * c.head_dim + d] != 0.0;
          empty_rows_wrong += wrong ? 1 : 0;
        }
        std::printf("gpu_attention_test: block-sparse %-52s b%lld h%lld/%lld n%lld/%lld | cos %.6f rel-L1 %.4f | lse "
                    "err %.2e | empty rows %lld\n",
                    name.c_str(), static_cast<long long>(c.batch), static_cast<long long>(c.heads_q),
                    static_cast<long long>(c.heads_kv), static_cast<long long>(c.tokens_q),
                    static_cast<long long>(c.tokens_kv), metrics.cosine_similarity, metrics.relative_l1, lse_error,
                    static_cast<long long>(empty_rows));
        CHECK(metrics.relative_l1 <= c.max_rel_l1_vs_reference);
        CHECK(metrics.cosine_similarity >= 0.999);
        CHECK(lse_error <= 0.01);
        CHECK(empty_rows_wrong == 0);
        CHECK((with_mask ? empty_rows > 0 : empty_rows == 0));
      }
    }
  }
  if (arch == schedules::GpuArch::sm90a)
    CHECK(schedules_run.count(std::string(schedules::Sm90Schedule::kName)) == 1);
}

TEST_CASE("the sm90 schedule: tails, rows with no visible key, GQA, and V that TMA cannot read") {
  if (skipWithoutGpu())
    return;
  if (runtime::currentDeviceArch() != schedules::GpuArch::sm90a) {
    std::printf("gpu_attention_test: SKIPPED sm90 cases: this GPU is not sm_90a\n");
    return;
  }
  const std::string sm90(schedules::Sm90Schedule::kName);
  const Case cases[] = {
      // q longer than kv, causal bottom-right: the first 133 rows see no key (O = 0, LSE = -inf)
      {"sage-b", 128, true, StorageType::f16, Layout::hnd, 2, 2, 333, 200, 0.0, 0.01, 0.999, 0.01},
      {"sage2-fp8", 128, true, StorageType::f16, Layout::nhd, 4, 1, 130, 1000, 0.0, 0.04, 0.999, 0.01},
      {"sage2-fp8", 64, false, StorageType::f16, Layout::hnd, 2, 2, 1, 77, 0.0, 0.04, 0.999, 0.01},
      {"sage-vb", 64, true, StorageType::bf16, Layout::nhd, 2, 2, 700, 700, 4.0, 0.02, 0.999, 0.01},
      // More tiles than an H100/H200 has SMs: persistent CTAs walk several, the next tile's Q and first K/V stages
      // loading while the last one's consumers finish (GQA; a tail; causal longest rows first; with 520 queries over
      // 300 keys bottom-right, the first Q block sees no key at all: a tile of zero blocks inside a CTA's walk).
      {"sage2-fp8", 128, false, StorageType::f16, Layout::hnd, 48, 12, 400, 400, 0.0, 0.04, 0.999, 0.01},
      {"sage2-fp8", 64, true, StorageType::f16, Layout::hnd, 36, 36, 640, 640, 8.0, 0.04, 0.999, 0.01},
      {"sage-b", 64, true, StorageType::bf16, Layout::nhd, 40, 8, 520, 300, 4.0, 0.01, 0.999, 0.01},
      {"sage-vb", 128, false, StorageType::f16, Layout::nhd, 34, 34, 512, 512, 0.0, 0.02, 0.999, 0.01},
  };
  for (const Case &c : cases) {
    CAPTURE(c.preset);
    runCase(c, {}, sm90);
  }

  // The caller's V read in place by TMA: a pointer off a 16-byte boundary is refused before anything runs.
  ir::Program program = dsl::preset("sage-b", 64)->build();
  runtime::AttentionRunnerOptions options;
  options.schedule = sm90;
  runtime::AttentionRunner runner(program.variant(), options);
  const schedules::ProblemShape shape{1, 1, 1, 64, 64, 64};
  const HostTensor q = randomTensor(1, 1, 64, 64, StorageType::f16, Layout::hnd, {1});
  DeviceTensor q_device(q), o_device(q.values().size() * 2 + 64), workspace(runner.workspaceBytes(shape));
  runtime::AttentionTensors tensors;
  tensors.q = tensors.k = q_device.get();
  tensors.v = static_cast<const char *>(q_device.get()) + 2;
  tensors.o = o_device.get();
  tensors.q_strides = tensors.k_strides = tensors.v_strides = tensors.o_strides = stridesOf(q);
  CHECK_THROWS_WITH_AS(runner.run(shape, tensors, workspace.get(), workspace.bytes, nullptr),
                       doctest::Contains("v: the sm90 schedule reads V in place with TMA"), std::invalid_argument);
  tensors.v = q_device.get();
  tensors.v_strides.token = 68; // not a multiple of 8 elements
  CHECK_THROWS_WITH_AS(runner.run(shape, tensors, workspace.get(), workspace.bytes, nullptr),
                       doctest::Contains("token strides"), std::invalid_argument);
}

TEST_CASE("AOT cubins are loaded first and compute what JIT kernels do; damaged ones are compiled instead") {
  if (skipWithoutGpu())
    return;
  // Variants no other case loads, so that the process's module registry cannot hand out a JIT-loaded module.
  const Case aot_case{"sage-vb", 64, true, StorageType::bf16, Layout::hnd, 2, 1, 256, 320, 0.0, 0.02, 0.999, 0.01};
  const Case damaged_case{"sage-vt", 128,   false, StorageType::bf16, Layout::nhd, 2, 2, 200, 200, 0.0,
                          0.02,      0.999, 0.01};
  const std::filesystem::path root =
      std::filesystem::temp_directory_path() / ("sagegen-gpu-aot-test." + std::to_string(::getpid()));
  std::filesystem::remove_all(root);
  writeAotDirectory(root / "good", aot_case);
  writeAotDirectory(root / "damaged", damaged_case);

  const std::string from_aot = runCase(aot_case, root / "good");
  std::printf("gpu_attention_test: AOT: %s\n", from_aot.c_str());
  CHECK(occurrences(from_aot, "[aot]") >= 2); // the prologue's launches and the attention kernel
  CHECK(occurrences(from_aot, "[built") + occurrences(from_aot, "[disk]") + occurrences(from_aot, "[memory]") == 0);

  for (const auto &item : std::filesystem::directory_iterator(root / "damaged"))
    if (item.path().extension() == ".cubin") {
      std::fstream cubin(item.path(), std::ios::in | std::ios::out | std::ios::binary);
      cubin.seekg(200);
      const char byte = static_cast<char>(cubin.get() ^ 0x20);
      cubin.seekp(200);
      cubin.put(byte);
    }
  const std::string from_damaged = runCase(damaged_case, root / "damaged");
  std::printf("gpu_attention_test: damaged AOT cubins: %s\n", from_damaged.c_str());
  CHECK(occurrences(from_damaged, "[aot]") == 0);
  std::filesystem::remove_all(root);
}

// Issue 28: Q and K rotated by the randomized Hadamard transform in the prologue, on the data the rotation is for (4 of
// d Q channels x20, K with a per-channel offset), on every schedule that runs the variant here. The prologue's codes
// are the reference's bit for bit (gpu_prologue_test's "rotated" cases), so the kernel sits as close to the reference
// of its (rotated) variant as the unrotated presets do to theirs: the same bounds as "kernels match the CPU
// reference of their variant". The rotation's gain is printed beside it: the unrotated preset's reference error.
TEST_CASE("rotated variants match the CPU reference on Q outlier channels") {
  if (skipWithoutGpu())
    return;
  struct RotatedCase {
    const char *preset;
    int head_dim;
    bool causal;
    StorageType storage;
    Layout layout;
    int64_t heads_q, heads_kv, tokens_q, tokens_kv;
    double max_rel_l1_vs_reference;
  };
  const RotatedCase cases[] = {
      {"sage-b", 128, false, StorageType::f16, Layout::hnd, 2, 2, 300, 300, 0.01},
      {"sage-b", 64, true, StorageType::bf16, Layout::nhd, 4, 2, 200, 333, 0.015},
      {"sage-t", 128, false, StorageType::f16, Layout::nhd, 2, 1, 190, 450, 0.01},
      {"sage2-fp8", 128, false, StorageType::f16, Layout::hnd, 2, 2, 300, 300, 0.04},
      {"sage2-fp8", 64, true, StorageType::bf16, Layout::hnd, 2, 1, 256, 256, 0.04},
      {"sage2-int4", 128, true, StorageType::f16, Layout::hnd, 2, 2, 256, 256, 0.04}, // delta_s of the unrotated K
  };
  const schedules::GpuArch arch = runtime::currentDeviceArch();
  int runs = 0;
  for (const RotatedCase &c : cases) {
    const MaskKind mask = c.causal ? MaskKind::causal : MaskKind::none;
    const AttentionVariant plain = dsl::preset(c.preset, c.head_dim, mask)->lse().describe();
    AttentionVariant rotated = plain;
    rotated.name += "-rot";
    rotated.q.rotation_seed = rotated.k.rotation_seed = 2026;
    const ir::Program program = dsl::emitProgram(rotated);
    const HostTensor q =
        randomTensor(1, c.heads_q, c.tokens_q, c.head_dim, c.storage, c.layout, {201, 0, 1, 0, 4, 20.0});
    const HostTensor k = randomTensor(1, c.heads_kv, c.tokens_kv, c.head_dim, c.storage, c.layout, {202, 0, 1, 8.0});
    const HostTensor v = randomTensor(1, c.heads_kv, c.tokens_kv, c.head_dim, c.storage, c.layout, {203});
    const AttentionResult expected = runReference(program.variant(), q, k, v);
    const AttentionResult exact = exactAttention(q, k, v, c.causal);
    const double reference_error = compareOutputs(exact.output, expected.output).relative_l1;
    const double unrotated_error = compareOutputs(exact.output, runReference(plain, q, k, v).output).relative_l1;
    const schedules::InputType input =
        c.storage == StorageType::bf16 ? schedules::InputType::bf16 : schedules::InputType::f16;
    for (const schedules::Schedule *schedule : schedules::allSchedules()) {
      if (!schedule->supports(program.variant(), arch, input))
        continue;
      const std::string name = rotated.name + (c.causal ? " causal" : "") + " on " + std::string(schedule->name());
      CAPTURE(name);
      CAPTURE(c.head_dim);
      const GpuRun run = runOnGpu(program, q, k, v, {}, std::string(schedule->name()));
      const AccuracyMetrics vs_reference = compareOutputs(expected.output, run.output);
      const AccuracyMetrics vs_exact = compareOutputs(exact.output, run.output);
      double lse_error = 0.0;
      for (size_t i = 0; i < run.lse.size(); ++i)
        if (std::isfinite(expected.lse[i]))
          lse_error = std::max(lse_error, std::fabs(run.lse[i] - expected.lse[i]));
      std::printf("gpu_attention_test: %-14s %-13s d%-3d %-6s %-4s q outliers x20, k bias 8 | vs reference cos %.6f "
                  "rel-L1 %.4f | vs exact cos %.6f rel-L1 %.4f (reference %.4f, unrotated reference %.4f) | lse err "
                  "%.2e\n",
                  std::string(schedule->name()).c_str(), rotated.name.c_str(), c.head_dim, c.causal ? "causal" : "full",
                  nameOf(c.storage).data(), vs_reference.cosine_similarity, vs_reference.relative_l1,
                  vs_exact.cosine_similarity, vs_exact.relative_l1, reference_error, unrotated_error, lse_error);
      CHECK(vs_reference.relative_l1 <= c.max_rel_l1_vs_reference);
      CHECK(vs_reference.cosine_similarity >= 0.999);
      CHECK(vs_exact.relative_l1 <= 1.25 * reference_error + 0.004);
      CHECK(lse_error <= 0.01);
      ++runs;
    }
  }
  CHECK(runs >= 6); // every case runs on some schedule of an sm_80+ GPU
}

// Issue 28: head dims 32..256 (steps of 16; 80, 96, 160, 192: d / 8 not a power of two, so the prologue's rows
// leave lanes idle and the sm80 kernel's shared rows are padded) for every forward preset, on every schedule that
// runs them here, against the CPU reference of the same variant, on data like a model's: K with per-channel offsets
// (bias 8, which K smoothing removes), Q with 4 outlier channels x 8, both inputs, causal and not, GQA and tails.
// Bounds: those of "kernels match the CPU reference of their variant" for the same preset and input.
TEST_CASE("host time of a warm call") {
  if (skipWithoutGpu())
    return;
  ir::Program program = dsl::preset("sage-b", 128)->build();
  runtime::AttentionRunnerOptions options;
  options.ir_fingerprint = program.fingerprint();
  runtime::AttentionRunner runner(program.variant(), options);
  const schedules::ProblemShape shape{1, 1, 1, 128, 128, 128};
  const HostTensor q = randomTensor(1, 1, 128, 128, StorageType::f16, Layout::hnd, {1});
  DeviceTensor q_device(q), k_device(q), v_device(q), o_device(q.values().size() * 2);
  DeviceTensor workspace(runner.workspaceBytes(shape));
  runtime::AttentionTensors tensors;
  tensors.q = q_device.get();
  tensors.k = k_device.get();
  tensors.v = v_device.get();
  tensors.o = o_device.get();
  tensors.q_strides = tensors.k_strides = tensors.v_strides = tensors.o_strides = stridesOf(q);
  runner.run(shape, tensors, workspace.get(), workspace.bytes, nullptr);
  runtime::CudaDriver::instance().synchronizeContext();
  constexpr int kCalls = 200; // few enough that the launch queue never fills
  const auto start = std::chrono::steady_clock::now();
  for (int call = 0; call < kCalls; ++call)
    runner.run(shape, tensors, workspace.get(), workspace.bytes, nullptr);
  const double microseconds =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / kCalls;
  runtime::CudaDriver::instance().synchronizeContext();

  // The baseline: the same number of launches of an empty kernel taking a parameter block of the same size, so the
  // difference is what sagegen itself adds to a call (checks, the cached shape plan, parameter packing).
  runtime::CompileRequest request;
  request.key = "empty launch baseline";
  request.source = "struct Block { unsigned long long words[" + std::to_string(sizeof(SageAttentionParams) / 8) +
                   "]; };\nextern \"C\" __global__ void empty(const Block) {}\n";
  request.options.arch = std::string(schedules::archName(runtime::currentDeviceArch()));
  const runtime::CompileResult compiled = runtime::NvrtcCompiler().compileCubin(request);
  const std::shared_ptr<runtime::LoadedModule> module = runtime::LoadedModule::load(compiled.image);
  const runtime::LoadedKernel empty = module->kernel("empty");
  struct Block {
    unsigned long long words[sizeof(SageAttentionParams) / 8];
  } block{};
  const int launches_per_call = static_cast<int>(runner.launchCount());
  const auto baseline_start = std::chrono::steady_clock::now();
  for (int call = 0; call < kCalls; ++call)
    for (int launch = 0; launch < launches_per_call; ++launch)
      empty.launch(block, {.grid = {1, 1, 1}, .block = {32, 1, 1}, .dynamic_shared_bytes = 0, .stream = nullptr});
  const double baseline =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - baseline_start).count() / kCalls;
  runtime::CudaDriver::instance().synchronizeContext();
  std::printf("gpu_attention_test: warm call host time %.2f us = %d bare launches %.2f us + sagegen %.2f us (%s)\n",
              microseconds, launches_per_call, baseline, microseconds - baseline, runner.describe().c_str());
}
