// A variant's kernels and their keys: launch order, distinct keys, and that the keys the runtime computes are the
// ones the committed AOT manifest (generated/) lists, byte for byte.
#include "sage/runtime/AttentionKernelSet.h"

#include "sage/dsl/Presets.h"
#include "sage/runtime/AotManifest.h"
#include "sage/runtime/AttentionKernelKeys.h"
#include "sage/runtime/NvrtcCompiler.h"
#include "sage/runtime/Sha256.h"
#include "sage/schedules/ScheduleRegistry.h"

#include <doctest/doctest.h>

#include <map>
#include <set>
#include <string>

using namespace sage;
using namespace sage::runtime;

namespace {

AttentionKernelSet kernelsOf(const std::string &preset, int head_dim, bool causal, schedules::InputType input,
                             schedules::GpuArch arch, std::string *fingerprint = nullptr) {
  ir::Program program = dsl::preset(preset, head_dim, causal ? MaskKind::causal : MaskKind::none)->build();
  AttentionKernelRequest request;
  request.input = input;
  request.arch = arch;
  request.ir_fingerprint = program.fingerprint();
  if (fingerprint)
    *fingerprint = request.ir_fingerprint;
  return generateAttentionKernels(program.variant(), request);
}

} // namespace

TEST_CASE("a variant's kernels: prologue launches in order, then attention, each keyed by its own source") {
  std::string fingerprint;
  AttentionKernelSet set =
      kernelsOf("sage-b", 128, true, schedules::InputType::bf16, schedules::GpuArch::sm90a, &fingerprint);
  const AttentionVariant variant = dsl::preset("sage-b", 128, MaskKind::causal)->build().variant();
  REQUIRE(set.kernels.size() == set.prologue.kernels.size() + 1);
  std::set<std::string> digests;
  for (size_t index = 0; index < set.kernels.size(); ++index) {
    const GeneratedKernel &kernel = set.kernels[index];
    const bool is_attention = index + 1 == set.kernels.size();
    CHECK(kernel.role == (is_attention ? AttentionKernelRole::attention : AttentionKernelRole::prologue));
    CHECK(kernel.entry_point == (is_attention ? set.attention.entry_point : set.prologue.kernels[index].entry_point));
    CHECK(kernel.key.ir_hash == fingerprint);
    CHECK(kernel.key.arch == "sm_90a");
    CHECK(kernel.key.causal);
    CHECK(kernel.key.head_dim == 128);
    CHECK(kernel.key.dtypes == "qkv=bf16,o=bf16");
    CHECK(kernel.key.compiler_version == nvrtcVersion());
    CHECK(kernel.key.tunables == schedules::tunablesText(set.plan.tunables));
    // The key hashes the self-contained text: the device library's headers are part of the kernel.
    CHECK(kernel.key.extra == kernel.entry_point + ";source-sha256=" + sha256Hex(selfContainedSource(kernel)));
    CHECK(kernel.key == attentionKernelKey(fingerprint, variant, set.plan, schedules::InputType::bf16,
                                           schedules::GpuArch::sm90a, kernel.entry_point, selfContainedSource(kernel)));
    CHECK(kernel.block[0] > 0);
    CHECK(!kernel.grid_rule.empty());
    digests.insert(kernel.key.digest());
  }
  CHECK(digests.size() == set.kernels.size());
  CHECK(set.kernels.back().dynamic_shared_bytes == set.attention.dynamic_shared_bytes);
}

TEST_CASE("keys change with the arch, the mask and the input type") {
  auto attention_digest = [](schedules::GpuArch arch, bool causal, schedules::InputType input) {
    return kernelsOf("sage-t", 64, causal, input, arch).kernels.back().key.digest();
  };
  const std::string base = attention_digest(schedules::GpuArch::sm80, false, schedules::InputType::f16);
  CHECK(base == attention_digest(schedules::GpuArch::sm80, false, schedules::InputType::f16));
  CHECK(base != attention_digest(schedules::GpuArch::sm89, false, schedules::InputType::f16));
  CHECK(base != attention_digest(schedules::GpuArch::sm80, true, schedules::InputType::f16));
  CHECK(base != attention_digest(schedules::GpuArch::sm80, false, schedules::InputType::bf16));
}

TEST_CASE("the runtime's keys for the committed default set are the ones generated/manifest.json lists") {
  AotManifest manifest = loadAotManifest(SAGEGEN_GENERATED_DIR);
  const bool same_compiler = manifest.nvrtc_version == nvrtcVersion();
  if (!same_compiler)
    MESSAGE("generated/ was made with NVRTC " << manifest.nvrtc_version << ", this is " << nvrtcVersion()
                                              << ": comparing the keys without their compiler_version");
  std::map<std::string, const AotKernelEntry *> listed;
  for (const AotKernelEntry &entry : manifest.kernels)
    listed[entry.key_text] = &entry;
  size_t matched = 0;
  for (const AotKernelEntry &entry : manifest.kernels) {
    if (entry.role != "attention")
      continue;
    const schedules::GpuArch arch = *schedules::parseArch(entry.arch);
    const schedules::InputType input = entry.input == "bf16" ? schedules::InputType::bf16 : schedules::InputType::f16;
    AttentionKernelSet set = kernelsOf(entry.preset, entry.head_dim, entry.causal, input, arch);
    for (GeneratedKernel &kernel : set.kernels) {
      if (!same_compiler)
        kernel.key.compiler_version = parseKernelKeyText(entry.key_text)->compiler_version;
      CAPTURE(kernel.key.text());
      CHECK_MESSAGE(listed.contains(kernel.key.text()),
                    "generated/ is out of date: build/tools/sagegen/sagegen emit --defaults -o generated/");
      ++matched;
    }
  }
  CHECK(matched == manifest.kernels.size());
}
