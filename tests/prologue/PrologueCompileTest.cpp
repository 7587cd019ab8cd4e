// Every kernel of the generated prologue compiles with NVRTC to a cubin for sm_80, sm_89, sm_90a, sm_100f and sm_120f,
// for each hand-built variant kind and every DSL preset (exact included: its Q and K are cast, not quantized) x
// head_dim {64, 128} x input {f16, bf16}, without warnings; the cubin holds the entry point.
#include "../support/DeviceLibraryCompile.h"
#include "../support/SweepSubset.h"
#include "PrologueTestVariants.h"
#include "sage/codegen/PrologueGenerator.h"
#include "sage/dsl/Presets.h"

#include <doctest/doctest.h>
#include <nvrtc.h>

#include <string>
#include <utility>
#include <vector>

using namespace sage;

namespace {

test::DeviceCompileResult compileKernel(const codegen::PrologueKernel &kernel, const char *arch) {
  test::NvrtcCompileOptions options;
  options.file_name = kernel.entry_point + ".cu";
  return test::compileWithNvrtc(kernel.source, arch, options);
}

// The hand-built kinds, then the presets, at one head_dim.
std::vector<AttentionVariant> variantsToCompile(int head_dim) {
  std::vector<AttentionVariant> variants;
  for (const prologue_test::VariantKind &kind : prologue_test::variantKinds())
    variants.push_back(prologue_test::makeVariant(kind, head_dim));
  for (const dsl::PresetInfo &info : dsl::presets())
    variants.push_back(dsl::preset(info.name, head_dim)->describe());
  // Issue 11's presets: int4 codes one per byte, Q smoothing's delta_s written by the K tiles; FP4 (NVFP4, MXFP4)
  // codes and microscales of Q, K and V^T (sage3-fp4-direct-p's prologue is sage3-fp4's).
  for (const char *name : {"sage2-int4", "sage2-int4-no-smooth-q", "sage3-fp4", "sage3-mxfp4"})
    variants.push_back(dsl::preset(name, head_dim)->describe());
  // Issue 28: Q and K rotated in the psi_Q and psi_K roles, per token, per block, per warp (e4m3 V) and per thread
  // (int4, with Q smoothing's delta_s from the unrotated K).
  for (const char *name : {"sage-t", "sage-b", "sage2-fp8", "sage2-int4"}) {
    AttentionVariant rotated = dsl::preset(name, head_dim)->describe();
    rotated.name += "-rot";
    rotated.q.rotation_seed = 1234;
    rotated.k.rotation_seed = 1234;
    variants.push_back(rotated);
  }
  return variants;
}

// One test case per architecture, so that CTest can run them in parallel (see CMakeLists.txt). In CI one of the four
// (head dim, input) combinations of each variant per arch, rotating over the archs (tests/support/SweepSubset.h).
void compileEveryVariantKind(const char *arch, int arch_index) {
  int compiled = 0;
  bool exact_seen = false;
  for (int head_dim : {64, 128}) {
    const std::vector<AttentionVariant> variants = variantsToCompile(head_dim);
    for (int v = 0; v < static_cast<int>(variants.size()); ++v)
      for (schedules::InputType input : {schedules::InputType::f16, schedules::InputType::bf16}) {
        const AttentionVariant &variant = variants[v];
        const int combination = (head_dim == 128 ? 2 : 0) + (input == schedules::InputType::bf16 ? 1 : 0);
        if (!test::sweepIncludes(v, arch_index, combination, 4))
          continue;
        exact_seen = exact_seen || variant.name == "exact";
        const codegen::PrologueSource prologue = codegen::PrologueGenerator::generate(variant, input, head_dim);
        REQUIRE(!prologue.kernels.empty());
        for (const codegen::PrologueKernel &kernel : prologue.kernels) {
          const std::string input_name = input == schedules::InputType::bf16 ? "bf16" : "f16";
          const std::string arch_name = arch;
          CAPTURE(variant.name);
          CAPTURE(head_dim);
          CAPTURE(input_name);
          CAPTURE(kernel.entry_point);
          CAPTURE(arch_name);
          const test::DeviceCompileResult result = compileKernel(kernel, arch);
          INFO(result.log);
          CHECK(result.compiled);
          CHECK(result.log.empty()); // no warnings either
          CHECK(result.cubin_bytes > 0);
          CHECK(kernel.source.find(kernel.entry_point + "(const __grid_constant__ SagePrologueParams params)") !=
                std::string::npos);
          ++compiled;
        }
      }
  }
  CHECK(exact_seen); // the unquantized preset is compiled, not skipped
  MESSAGE("compiled " << compiled << " prologue kernels for " << std::string(arch));
}

} // namespace

// v_codes in the wgmma token order (the option of the Hopper kernel, so compiled for sm_90a only: the change is
// index arithmetic, the same on every arch): the V-quantizing kernel of each per-channel V kind, smoothed and
// not, f16 and bf16, d 64 and 128.
void compileInterleavedVCodes(const char *arch) {
  codegen::PrologueOptions options;
  options.v_codes_token_order = schedules::VCodesTokenOrder::wgmma_interleaved_32;
  int compiled = 0;
  for (int head_dim : {64, 128})
    for (const prologue_test::VariantKind &kind : prologue_test::variantKinds()) {
      if (kind.v == prologue_test::VKind::f16)
        continue;
      const AttentionVariant variant = prologue_test::makeVariant(kind, head_dim);
      for (schedules::InputType input : {schedules::InputType::f16, schedules::InputType::bf16})
        for (const codegen::PrologueKernel &kernel :
             codegen::PrologueGenerator::generate(variant, input, head_dim, {}, options).kernels) {
          if (kernel.source.find("vTokenAtPosition") == std::string::npos)
            continue;
          CAPTURE(variant.name);
          CAPTURE(head_dim);
          CAPTURE(kernel.entry_point);
          const test::DeviceCompileResult result = compileKernel(kernel, arch);
          INFO(result.log);
          CHECK(result.compiled);
          CHECK(result.log.empty());
          ++compiled;
        }
    }
  int per_channel_kinds = 0;
  for (const prologue_test::VariantKind &kind : prologue_test::variantKinds())
    per_channel_kinds += kind.v == prologue_test::VKind::f16 ? 0 : 1;
  CHECK(compiled == 2 * 2 * per_channel_kinds); // d 64 and 128, f16 and bf16: one V-quantizing kernel each
}

// The opt-in one-pass launch (PrologueTunables::one_pass), on every arch: K statistics only (sage-b, f16 V read in
// place; bf16 adds V's copy as a role that waits for nothing), K and V statistics (sage2-fp8, rotated), V statistics
// only (K unsmoothed).
void compileOnePass(const char *arch) {
  codegen::PrologueTunables tunables;
  tunables.one_pass = true;
  std::vector<std::pair<AttentionVariant, schedules::InputType>> cases = {
      {dsl::preset("sage-b", 128)->describe(), schedules::InputType::f16},
      {dsl::preset("sage-b", 64)->describe(), schedules::InputType::bf16},
      {dsl::preset("sage2-fp8", 128)->describe(), schedules::InputType::bf16}};
  AttentionVariant rotated = dsl::preset("sage2-fp8", 64)->describe();
  rotated.q.rotation_seed = rotated.k.rotation_seed = 9;
  cases.emplace_back(rotated, schedules::InputType::f16);
  AttentionVariant v_only = dsl::preset("sage-vb", 128)->describe();
  v_only.smooth_k = SmoothScope::none;
  cases.emplace_back(v_only, schedules::InputType::f16);
  for (const auto &[variant, input] : cases) {
    const codegen::PrologueSource prologue =
        codegen::PrologueGenerator::generate(variant, input, variant.head_dim, tunables);
    REQUIRE(prologue.kernels.size() == 1);
    REQUIRE(prologue.kernels[0].one_pass);
    CAPTURE(variant.name);
    CAPTURE(variant.head_dim);
    const test::DeviceCompileResult result = compileKernel(prologue.kernels[0], arch);
    INFO(result.log);
    CHECK(result.compiled);
    CHECK(result.log.empty());
    CHECK(result.cubin_bytes > 0);
  }
}

TEST_CASE("prologue kernels compile for sm_80") { compileEveryVariantKind("sm_80", 0); }
TEST_CASE("prologue kernels compile for sm_89") { compileEveryVariantKind("sm_89", 1); }
TEST_CASE("prologue kernels compile for sm_90a") { compileEveryVariantKind("sm_90a", 2); }
TEST_CASE("interleaved V codes compile for sm_90a") { compileInterleavedVCodes("sm_90a"); }
TEST_CASE("prologue kernels compile for sm_100f") { compileEveryVariantKind("sm_100f", 3); }
TEST_CASE("prologue kernels compile for sm_120f") { compileEveryVariantKind("sm_120f", 4); }
TEST_CASE("one-pass prologue kernels compile for sm_80") { compileOnePass("sm_80"); }
TEST_CASE("one-pass prologue kernels compile for sm_89") { compileOnePass("sm_89"); }
TEST_CASE("one-pass prologue kernels compile for sm_90a") { compileOnePass("sm_90a"); }
TEST_CASE("one-pass prologue kernels compile for sm_100f") { compileOnePass("sm_100f"); }
TEST_CASE("one-pass prologue kernels compile for sm_120f") { compileOnePass("sm_120f"); }
