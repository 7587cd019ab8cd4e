// SLA's kernels (issue 13): the generated translation unit for each SLA preset x head dim x input x arch compiles with
// NVRTC to a cubin without spills (libnvrtc directly: no GPU needed); the generator's refusals and the
// pre-aggregation rule; the mask prediction's rows per CTA.
#include "sage/codegen/DeviceLibrary.h"
#include "sage/codegen/SlaKernels.h"
#include "sage/dsl/Presets.h"
#include "sage/schedules/GpuArch.h"

#include "../support/DeviceLibraryCompile.h"
#include "../support/SweepSubset.h"

#include <doctest/doctest.h>
#include <nvrtc.h>

#include <regex>
#include <sstream>
#include <string>

using namespace sage;
using namespace sage::codegen;

namespace {

test::DeviceCompileResult compile(const SlaKernelSource &kernel, const std::string &arch) {
  test::NvrtcCompileOptions options;
  options.file_name = kernel.name + ".cu";
  options.ptxas_report = true;
  test::DeviceCompileResult result = test::compileWithNvrtc(expandDeviceIncludes(kernel.source), arch, options);
  result.compiled = result.compiled && result.cubin_bytes > 0;
  return result;
}

} // namespace

// In CI one (head dim, input) per (preset, arch), rotating (../support/SweepSubset.h); SAGEGEN_FULL_SWEEPS=1 compiles
// all four.
TEST_CASE("the SLA kernels compile for sm_80, sm_89 and sm_90a without spills") {
  const std::vector<dsl::PresetInfo> &presets = dsl::slaPresets();
  for (int p = 0; p < static_cast<int>(presets.size()); ++p)
    for (int head_dim : {64, 128})
      for (schedules::InputType input : {schedules::InputType::f16, schedules::InputType::bf16}) {
        const bool bf16 = input == schedules::InputType::bf16;
        const AttentionVariant variant = dsl::preset(presets[p].name, head_dim)->describe();
        const SlaKernelSource kernel = generateSlaKernels(variant, input);
        const char *archs[] = {"sm_80", "sm_89", "sm_90a"};
        for (int a = 0; a < 3; ++a) {
          const char *arch = archs[a];
          if (!test::sweepIncludes(p, a, (head_dim == 128 ? 1 : 0) + (bf16 ? 2 : 0), 4))
            continue;
          CAPTURE(kernel.name);
          CAPTURE(std::string(arch));
          const test::DeviceCompileResult outcome = compile(kernel, arch);
          INFO(outcome.log);
          REQUIRE(outcome.compiled);
          for (std::string_view entry : kernel.entry_points)
            CHECK(outcome.log.find(std::string(entry)) != std::string::npos); // ptxas reports every kernel
          // Static shared memory plus each kernel's dynamic shared memory fit the smallest of these archs (sm_89:
          // 99 KiB per block).
          const auto dynamic_bytes = [&](const std::string &function) {
            if (function == kSlaRowsBackwardKernel)
              return slaRowsBackwardSharedBytes(head_dim, variant.block_q);
            if (function == kSlaKvBackwardKernel)
              return slaKvBackwardSharedBytes(head_dim);
            if (function == kSlaOutputKernel)
              return slaOutputSharedBytes(head_dim, variant.block_q);
            if (function == kSlaMaskGemmKernel || function == kSlaColumnsMaskGemmKernel)
              return slaMaskGemmSharedBytes(schedules::computeCapability(*schedules::parseArch(arch)));
            if (function == kSlaSparseStatisticsKernel)
              return slaSparseBackwardSharedBytes(head_dim, variant.block_q, variant.block_kv);
            if (function == kSlaSparseFusedBackwardKernel)
              return slaSparseFusedSharedBytes(head_dim, variant.block_q, variant.block_kv,
                                               schedules::computeCapability(*schedules::parseArch(arch)), bf16);
            return 0;
          };
          // The fused sparse backward takes two stages where the arch's opt-in limit allows (sm_80: 163 KiB, sm_90:
          // 227 KiB per block), one on sm_89; the mask GEMMs take 227 KiB on sm_90a (wgmma); every other kernel fits
          // 99 KiB everywhere.
          const auto limit_bytes = [&](const std::string &function) {
            const bool mask_gemm = function == kSlaMaskGemmKernel || function == kSlaColumnsMaskGemmKernel;
            if (mask_gemm && std::string(arch) == "sm_90a")
              return 227 * 1024;
            if (function != kSlaSparseFusedBackwardKernel || std::string(arch) == "sm_89")
              return 99 * 1024;
            return std::string(arch) == "sm_80" ? 163 * 1024 : 227 * 1024;
          };
          for (std::string_view entry : kernel.entry_points)
            CHECK(dynamic_bytes(std::string(entry)) <= limit_bytes(std::string(entry)));
          std::istringstream lines(outcome.log);
          std::string line, function;
          std::smatch found;
          while (std::getline(lines, line)) {
            if (std::regex_search(line, found, std::regex(R"(Compiling entry function '(\w+)')")))
              function = found[1];
            if (std::regex_search(line, found, std::regex(R"((\d+) bytes smem)"))) {
              CAPTURE(function);
              CHECK(std::stoi(found[1]) + dynamic_bytes(function) <= limit_bytes(function));
            }
          }
          std::smatch match;
          std::string rest = outcome.log;
          while (std::regex_search(rest, match, std::regex(R"((\d+) bytes spill stores)"))) {
            CHECK(std::stoi(match[1]) == 0);
            rest = match.suffix();
          }
        }
      }
}

TEST_CASE("the fused sparse backward's stages and shared memory per arch") {
  // Two stages on the archs with 163 KiB or more per block, one on the 99 KiB ones.
  CHECK(sage_sla_sparse_fused_stages(80) == 2);
  CHECK(sage_sla_sparse_fused_stages(86) == 1);
  CHECK(sage_sla_sparse_fused_stages(89) == 1);
  CHECK(sage_sla_sparse_fused_stages(90) == 2);
  CHECK(sage_sla_sparse_fused_stages(100) == 2);
  CHECK(sage_sla_sparse_fused_stages(120) == 1);
  // d = 128, blocks 64: K, V, dS^T (64 x 72 halves) and per stage Q, dO^s (64 x 136 halves each), L and D^s.
  CHECK(slaSparseFusedSharedBytes(128, 64, 64, 80) == 2 * (2 * 64 * 136 + 64 * 72 + 2 * 2 * 64 * 136) + 2 * 512);
  CHECK(slaSparseFusedSharedBytes(128, 64, 64, 89) == 2 * (2 * 64 * 136 + 64 * 72 + 2 * 64 * 136) + 512);
  // sm_90a's wgmma kernel (blocks 64, d = 64 or 128): unpadded swizzled tiles (a stage's Q and dO^s then hold dQ's
  // unpadded f32 tile), 1024 bytes of alignment slack; two CTAs per SM (228 KiB, 1 KiB reserved per CTA). Other shapes
  // keep the mma.sync kernel's layout.
  CHECK(sage_sla_sparse_fused_wgmma(90, 128, 64, 64, 0));
  CHECK(sage_sla_sparse_fused_wgmma(90, 64, 64, 64, 0));
  CHECK_FALSE(sage_sla_sparse_fused_wgmma(90, 32, 64, 64, 0));
  CHECK_FALSE(sage_sla_sparse_fused_wgmma(90, 128, 128, 64, 0));
  CHECK_FALSE(sage_sla_sparse_fused_wgmma(90, 128, 64, 32, 0));
  CHECK_FALSE(sage_sla_sparse_fused_wgmma(80, 128, 64, 64, 0));
  CHECK_FALSE(sage_sla_sparse_fused_wgmma(100, 128, 64, 64, 0));
  // A bf16 module runs the mma.sync kernel on sm_90a too, with its two stages.
  CHECK_FALSE(sage_sla_sparse_fused_wgmma(90, 128, 64, 64, 1));
  CHECK(slaSparseFusedSharedBytes(128, 64, 64, 90, true) == sage_sla_sparse_fused_shared_bytes(128, 64, 64, 2));
  CHECK(slaSparseFusedSharedBytes(128, 64, 64, 90) == 2 * (2 * 64 * 128 + 64 * 64 + 2 * 2 * 64 * 128) + 2 * 512 + 1024);
  CHECK(2 * (slaSparseFusedSharedBytes(128, 64, 64, 90) + 1024) <= 228 * 1024);
  CHECK(slaSparseFusedSharedBytes(32, 64, 64, 90) == sage_sla_sparse_fused_shared_bytes(32, 64, 64, 2));
  for (int sm : {80, 86, 89, 90, 100, 120})
    for (int head_dim : {16, 32, 64, 128}) {
      CAPTURE(sm);
      CAPTURE(head_dim);
      CHECK(slaSparseFusedSharedBytes(head_dim, 64, 64, sm) <=
            (sage_sla_sparse_fused_stages(sm) == 2 ? 163 : 99) * 1024);
    }
}

TEST_CASE("the SLA kernel source names its steps and constants") {
  const SlaKernelSource kernel = generateSlaKernels(dsl::preset("sla-f16-elu", 128)->describe());
  CHECK(kernel.name == "sage_sla_d128_bq64_bkv64_elu_plus_one");
  for (const char *text :
       {"constexpr int kHeadDim = 128;", "constexpr int kBlockKv = 64;", "constexpr int kPhi = 1;",
        "top 5% critical, bottom 10% negligible", "#include \"sage/device/sla/mask_prediction.cuh\""}) {
    CAPTURE(std::string(text));
    CHECK(kernel.source.find(text) != std::string::npos);
  }
}

TEST_CASE("a bf16 SLA module has its own name and element type; an f16 one keeps its name") {
  const AttentionVariant variant = dsl::preset("sla-f16", 64)->describe();
  const SlaKernelSource f16 = generateSlaKernels(variant);
  const SlaKernelSource bf16 = generateSlaKernels(variant, schedules::InputType::bf16);
  CHECK(f16.name == "sage_sla_d64_bq64_bkv64_softmax");
  CHECK(bf16.name == "sage_sla_d64_bq64_bkv64_softmax_bf16");
  CHECK(f16.source.find("constexpr bool kBf16 = false;") != std::string::npos);
  CHECK(bf16.source.find("constexpr bool kBf16 = true;") != std::string::npos);
}

TEST_CASE("the SLA generator refuses what its kernels cannot run") {
  CHECK_THROWS_WITH_AS(generateSlaKernels(dsl::preset("sage-b", 128)->describe()),
                       doctest::Contains("is not an SLA variant"), std::invalid_argument);
  AttentionVariant wide = dsl::preset("sla-f16", 128)->describe();
  wide.head_dim = 256;
  CHECK_THROWS_WITH_AS(generateSlaKernels(wide), doctest::Contains("head_dim: the SLA kernels take"),
                       std::invalid_argument);
}

TEST_CASE("pre-aggregation when the marginal blocks are the majority of a row") {
  SlaSpec spec; // 5% critical, 10% negligible: 85% marginal
  CHECK(slaMarginalMajority(spec, 512));
  spec.critical_percent = 40.0;
  spec.negligible_percent = 20.0;
  CHECK_FALSE(slaMarginalMajority(spec, 10)); // 4 + 2 non-marginal, 4 marginal
  spec.negligible_percent = 5.0;
  CHECK(slaMarginalMajority(spec, 20)); // 8 + 1 non-marginal, 11 marginal
}

TEST_CASE("the mask prediction's rows per CTA keep their logits within its shared memory") {
  // 16 rows up to 512 kv blocks, then halved as the rows widen, never below 2 (kv_blocks <= 4096).
  CHECK(sage_sla_predict_rows(1) == 16);
  CHECK(sage_sla_predict_rows(512) == 16);
  CHECK(sage_sla_predict_rows(513) == 8);
  CHECK(sage_sla_predict_rows(1101) == 4);
  CHECK(sage_sla_predict_rows(kSlaMaxKvBlocks) == 2);
  for (int kv_blocks = 1; kv_blocks <= kSlaMaxKvBlocks; ++kv_blocks) {
    const int rows = sage_sla_predict_rows(kv_blocks);
    CAPTURE(kv_blocks);
    CHECK(rows * kv_blocks <= SAGE_SLA_PREDICT_KEYS);
    CHECK((rows == SAGE_SLA_PREDICT_MAX_ROWS || 2 * rows * kv_blocks > SAGE_SLA_PREDICT_KEYS));
  }
}

TEST_CASE("the backward's rows and kv kernels' shared memory fits sm_89 for every head dim and block") {
  // H_i in f16 plus a 32-row chunk of phi(Q) and W split in hi + lo, then Z_i, dZ_i, 1 / den, two reductions (f32).
  CHECK(slaRowsBackwardSharedBytes(128, 64) == 2 * 136 * (128 + 4 * 32) + 4 * (2 * 128 + 64 + 8 * 32 + 8));
  CHECK(slaRowsBackwardSharedBytes(128, 64) == 71968); // SlaKernels.h and the READMEs quote it
  // dh_j split in hi + lo plus a chunk of phi(K) (split) and V, then dz_j and one reduction.
  CHECK(slaKvBackwardSharedBytes(128) == 2 * 136 * (2 * 128 + 3 * 32) + 4 * (128 + 4 * 32 + 8));
  CHECK(slaKvBackwardSharedBytes(128) == 96800);
  for (int head_dim : {16, 32, 64, 128}) {
    CAPTURE(head_dim);
    CHECK(slaKvBackwardSharedBytes(head_dim) <= 99 * 1024);
    for (int block_q : {16, 32, 64, 128}) {
      CAPTURE(block_q);
      CHECK(slaRowsBackwardSharedBytes(head_dim, block_q) <= 99 * 1024);
    }
  }
}

TEST_CASE("the mask GEMMs' grid and shared memory per arch") {
  // sm_90a: wgmma over 256-column tiles, four per CTA (the last CTA may walk fewer); elsewhere one 128-column tile
  // per CTA. Shared memory: five S buffers, two A buffers and the factor table on sm_90a; 80,416 bytes elsewhere.
  CHECK(slaMaskGemmColumnCtas(90, 128) == 16);
  CHECK(slaMaskGemmColumnCtas(90, 64) == 4);
  CHECK(slaMaskGemmColumnCtas(90, 32) == 1);
  CHECK(slaMaskGemmColumnCtas(90, 16) == 1);
  CHECK(slaMaskGemmColumnCtas(80, 128) == 128);
  CHECK(slaMaskGemmColumnCtas(89, 16) == 2);
  CHECK(slaMaskGemmColumnCtas(100, 64) == 32);
  CHECK(slaMaskGemmSharedBytes(90) == 2 * (2 * 128 * 64 + 5 * 64 * 256 + 4096) + 4 * (128 + 8) + 1024);
  CHECK(slaMaskGemmSharedBytes(90) <= 227 * 1024);
  for (int sm : {80, 86, 89, 100, 120})
    CHECK(slaMaskGemmSharedBytes(sm) == 80416);
}
