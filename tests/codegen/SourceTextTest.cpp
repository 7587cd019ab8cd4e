// Issue 26: a variant's name reached generated CUDA unescaped, inside // comments, so a newline in it put lines of
// its own before NVRTC (`#error`, or a `#define` that silently changes the kernel). Every generator (forward sm80,
// sm90 and sm120, prologue, backward sm80 and sm90, SLA) takes names through sourceSafe(): here each gets hostile
// names and must write the same code as for a plain name, with the name only in comment lines that NVRTC ignores.
// (The IR refuses such names outright: tests/ir/HostileInputTest.cpp; this covers variants built without the IR.)
#include "sage/codegen/SourceText.h"
#include "sage/codegen/AttentionKernelGenerator.h"
#include "sage/codegen/BackwardKernelGenerator.h"
#include "sage/codegen/PrologueGenerator.h"
#include "sage/codegen/SlaKernels.h"
#include "sage/dsl/AttentionBackward.h"
#include "sage/dsl/Presets.h"
#include "sage/schedules/BackwardSchedule.h"
#include "sage/schedules/ScheduleRegistry.h"

#include <doctest/doctest.h>
#include <nvrtc.h>

#include <functional>
#include <sstream>
#include <string>
#include <vector>

using namespace sage;
using namespace sage::codegen;
using namespace sage::schedules;

namespace {

struct HostileName {
  std::string text;
  bool breaks_unescaped; // written raw into a comment, NVRTC would see its #error
};

const std::vector<HostileName> &hostileNames() {
  static const std::vector<HostileName> names = {
      {"x\n#error injected", true},
      {"x\r#error injected", false}, // NVRTC takes a lone CR for no line break, but a compiler may
      {"x\r\n#error injected", true},
      {std::string("x\0\n#error injected", 18), false}, // NVRTC would read the source only up to the NUL
      {"x\\\n#error injected", false}, // a backslash-newline splices the next generated line into the comment
      {"x */ #error injected /*", false},
      {"x\n#define kHeadDim 1\n", false},
      {"x\xE2\x80\xA8#error injected", false}, // U+2028 LINE SEPARATOR
      {"x\xE2\x80\xA9#error injected", false}, // U+2029 PARAGRAPH SEPARATOR
      {"x?\?/\n#error injected", true},        // ??/, a trigraph backslash
      {"x\" \"\f\v#error injected", false},
      {"%0A", false}, // an escape's spelling is escaped too
  };
  return names;
}

// One generated translation unit and the kernel names derived from the variant's name.
struct Generated {
  std::string source;
  std::vector<std::string> names;
};

bool isCommentLine(const std::string &line) {
  const size_t first = line.find_first_not_of(" \t");
  return first != std::string::npos && line.compare(first, 2, "//") == 0;
}

std::vector<std::string> linesOf(const std::string &text) {
  std::vector<std::string> lines;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);)
    lines.push_back(line);
  return lines;
}

// `generated` without its comment lines, its kernel names replaced by `names` (the plain name's).
std::string codeOf(const Generated &generated, const std::vector<std::string> &names) {
  std::string code;
  for (const std::string &line : linesOf(generated.source))
    if (!isCommentLine(line))
      code += line + "\n";
  for (size_t i = 0; i < generated.names.size(); ++i)
    for (size_t at = code.find(generated.names[i]); at != std::string::npos;
         at = code.find(generated.names[i], at + names[i].size()))
      code.replace(at, generated.names[i].size(), names[i]);
  return code;
}

bool compiles(const std::string &source) {
  nvrtcProgram program = nullptr;
  if (nvrtcCreateProgram(&program, source.c_str(), "names.cu", 0, nullptr, nullptr) != NVRTC_SUCCESS)
    return false;
  const char *options[] = {"--gpu-architecture=sm_80", "-std=c++17"};
  const bool compiled = nvrtcCompileProgram(program, 2, options) == NVRTC_SUCCESS;
  nvrtcDestroyProgram(&program);
  return compiled;
}

// Every generator, as a function of the variant's name.
std::vector<std::pair<std::string, std::function<std::vector<Generated>(const std::string &)>>> generators() {
  const auto forward = [](const char *preset, int head_dim, GpuArch arch, const char *schedule) {
    return [=](const std::string &name) {
      AttentionVariant variant = dsl::preset(preset, head_dim, MaskKind::causal)->describe();
      variant.name = name;
      const KernelPlan plan = planBestSchedule(variant, arch, InputType::f16);
      REQUIRE(plan.schedule == schedule);
      const KernelSource kernel = AttentionKernelGenerator::generate(variant, plan);
      return std::vector<Generated>{{kernel.source, {kernel.name}}};
    };
  };
  const auto prologue = [](const std::string &name) {
    AttentionVariant variant = dsl::preset("sage-b", 128)->describe();
    variant.name = name;
    std::vector<Generated> generated;
    for (const PrologueKernel &kernel : PrologueGenerator::generate(variant, InputType::f16, 128).kernels)
      generated.push_back({kernel.source, {}});
    return generated;
  };
  const auto backward = [](const std::string &name) {
    BackwardVariant variant = dsl::backwardPreset("sagebwd", 128, MaskKind::causal)->describe();
    variant.name = name;
    std::vector<Generated> generated;
    for (const BackwardSchedule *schedule : allBackwardSchedules())
      if (schedule->supports(variant, GpuArch::sm90a, InputType::f16)) {
        const BackwardKernelSource kernel =
            BackwardKernelGenerator::generate(variant, schedule->plan(variant, GpuArch::sm90a, InputType::f16));
        generated.push_back({kernel.source, {kernel.name}});
      }
    REQUIRE(generated.size() == 2); // sm80.mma_sync_backward and sm90.wgmma_backward
    return generated;
  };
  const auto sla = [](const std::string &name) {
    AttentionVariant variant = dsl::preset("sla-f16", 128)->describe();
    variant.name = name;
    return std::vector<Generated>{{generateSlaKernels(variant).source, {}}};
  };
  return {{"forward sm80", forward("sage-b", 64, GpuArch::sm89, "sm80.mma_sync")},
          {"forward sm90", forward("sage-b", 128, GpuArch::sm90a, "sm90.wgmma_tma")},
          {"forward sm120", forward("sage3-fp4", 128, GpuArch::sm120f, "sm120.mma_fp4")},
          {"prologue", prologue},
          {"backward", backward},
          {"sla", sla}};
}

} // namespace

TEST_CASE("sourceSafe keeps program names and escapes every other byte") {
  CHECK(sourceSafe("sage2-int4-no-smooth-q_v1.2") == "sage2-int4-no-smooth-q_v1.2");
  CHECK(sourceSafe(std::string("a\n\r\0\\*/?#% \xE2\x80\xA8", 14)) == "a%0A%0D%00%5C%2A%2F%3F%23%25%20%E2%80%A8");
  CHECK(sourceSafe("") == "");
}

TEST_CASE("hostile variant names reach no generator's code, only its comments") {
  for (const auto &[generator, generate] : generators()) {
    CAPTURE(generator);
    const std::vector<Generated> plain = generate("x");
    for (const HostileName &hostile : hostileNames()) {
      CAPTURE(sourceSafe(hostile.text));
      const std::vector<Generated> generated = generate(hostile.text);
      REQUIRE(generated.size() == plain.size());
      std::string name_lines; // the lines that hold the name, as NVRTC reads them
      for (size_t unit = 0; unit < generated.size(); ++unit) {
        // The same code as for the plain name: a directive or line of the name's would be in it.
        CHECK(codeOf(generated[unit], plain[unit].names) == codeOf(plain[unit], plain[unit].names));
        for (const std::string &line : linesOf(generated[unit].source))
          if (line.find(sourceSafe(hostile.text)) != std::string::npos) {
            CHECK_MESSAGE(isCommentLine(line), line);
            CHECK(line.back() != '\\');
            name_lines += line + "\n";
          }
        CHECK(generated[unit].source.find(hostile.text) == std::string::npos);
      }
      REQUIRE_FALSE(name_lines.empty());
      // NVRTC reads those lines as comments; written raw they would stop it (so this check can fail).
      const std::string kernel = "extern \"C\" __global__ void names_kernel(int *x) { *x = 1; }\n";
      CHECK(compiles(name_lines + kernel));
      if (hostile.breaks_unescaped) {
        std::string raw = name_lines;
        for (size_t at = raw.find(sourceSafe(hostile.text)); at != std::string::npos;
             at = raw.find(sourceSafe(hostile.text), at + hostile.text.size()))
          raw.replace(at, sourceSafe(hostile.text).size(), hostile.text);
        CHECK_FALSE(compiles(raw + kernel));
      }
    }
  }
}
