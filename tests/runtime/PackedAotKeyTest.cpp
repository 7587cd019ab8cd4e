// What `sagegen emit --packed` relies on (issue 28): the kernels it generates from a preset built with
// packed_sequences carry exactly the keys that a dense runner's packed runner computes at its first packed call
// (AttentionRunner::packedRunner: packedSequencesOf the dense variant, with that IR's fingerprint), so an AOT
// directory serves them to sage_attention_run_varlen; and none of them is a dense kernel's key. No GPU needed.
#include "sage/dsl/Presets.h"
#include "sage/ir/AttentionVariant.h"
#include "sage/runtime/AttentionKernelSet.h"

#include <doctest/doctest.h>

#include <set>
#include <string>
#include <vector>

using namespace sage;

namespace {

std::vector<std::string> digests(const AttentionVariant &variant, const std::string &fingerprint,
                                 schedules::GpuArch arch, schedules::InputType input) {
  runtime::AttentionKernelRequest request;
  request.input = input;
  request.arch = arch;
  request.ir_fingerprint = fingerprint;
  std::vector<std::string> result;
  for (const runtime::GeneratedKernel &kernel : runtime::generateAttentionKernels(variant, request).kernels)
    result.push_back(kernel.key.digest());
  return result;
}

} // namespace

TEST_CASE("emit --packed's keys are the packed runner's, and differ from every dense key") {
  struct Case {
    const char *preset;
    int head_dim;
    MaskKind mask;
    bool lse;
    schedules::GpuArch arch;
    schedules::InputType input;
  };
  const Case cases[] = {
      {"sage-b", 128, MaskKind::causal, true, schedules::GpuArch::sm90a, schedules::InputType::f16},
      {"sage-b", 64, MaskKind::none, false, schedules::GpuArch::sm80, schedules::InputType::bf16},
      {"sage2-fp8", 128, MaskKind::causal, false, schedules::GpuArch::sm89, schedules::InputType::f16},
  };
  for (const Case &c : cases) {
    CAPTURE(c.preset);
    CAPTURE(c.head_dim);
    auto builder = dsl::preset(c.preset, c.head_dim, c.mask);
    REQUIRE(builder);
    builder->lse(c.lse);
    const ir::Program dense = builder->build();
    const ir::Program emitted = builder->packed_sequences(true).build(); // what `emit --packed` builds
    const AttentionVariant packed = packedSequencesOf(dense.variant());  // what the packed runner builds
    const std::vector<std::string> from_emit = digests(emitted.variant(), emitted.fingerprint(), c.arch, c.input);
    const std::vector<std::string> from_runner =
        digests(packed, dsl::emitProgram(packed).fingerprint(), c.arch, c.input);
    CHECK(from_emit == from_runner);
    CHECK(from_emit.size() >= 2); // the prologue's launches and the attention kernel
    const std::vector<std::string> dense_digests = digests(dense.variant(), dense.fingerprint(), c.arch, c.input);
    const std::set<std::string> dense_set(dense_digests.begin(), dense_digests.end());
    for (const std::string &digest : from_emit)
      CHECK_FALSE(dense_set.contains(digest));
  }
}
