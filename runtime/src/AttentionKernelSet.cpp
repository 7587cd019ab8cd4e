#include "sage/runtime/AttentionKernelSet.h"

#include "sage/codegen/AttentionKernelGenerator.h"
#include "sage/codegen/DeviceLibrary.h"
#include "sage/runtime/AttentionKernelKeys.h"
#include "sage/runtime/NvrtcCompiler.h"
#include "sage/schedules/ScheduleRegistry.h"
#include "sage/schedules/UnsupportedError.h"

#include <chrono>

namespace sage::runtime {

std::string_view nameOf(AttentionKernelRole role) {
  switch (role) {
  case AttentionKernelRole::prologue:
    return "prologue";
  case AttentionKernelRole::attention:
    return "attention";
  case AttentionKernelRole::backward:
    return "backward";
  case AttentionKernelRole::sla:
    return "sla";
  case AttentionKernelRole::merge:
    return "merge";
  }
  return "unknown";
}

AttentionKernelSet generateAttentionKernels(const AttentionVariant &variant, const AttentionKernelRequest &request) {
  AttentionKernelSet set;
  if (request.schedule.empty()) {
    set.plan = schedules::planBestSchedule(variant, request.arch, request.input, request.tunables);
  } else {
    const schedules::Schedule *schedule = schedules::findSchedule(request.schedule);
    if (!schedule)
      throw std::invalid_argument("schedule: no schedule is named '" + request.schedule + "'");
    set.plan = schedule->plan(variant, request.arch, request.input, request.tunables);
  }
  set.attention = codegen::AttentionKernelGenerator::generate(variant, set.plan, request.input);
  codegen::PrologueOptions prologue_options;
  if (set.plan.wgmma_value_token_order) // the sm90 kernel's 8-bit P.V reads V^T in its accumulator's token order
    prologue_options.v_codes_token_order = schedules::VCodesTokenOrder::wgmma_interleaved_32;
  try {
    set.prologue = codegen::PrologueGenerator::generate(variant, request.input, variant.head_dim, {}, prologue_options);
  } catch (const schedules::UnsupportedError &) {
    throw;
  } catch (const std::invalid_argument &error) {
    // The variant verified, but the quantization prologue cannot produce its operands.
    throw schedules::UnsupportedError(std::string("prologue: ") + error.what());
  }

  auto add = [&](AttentionKernelRole role, const std::string &name, const std::string &entry_point,
                 const std::string &source, std::array<unsigned, 3> block, int dynamic_shared_bytes,
                 const std::string &grid_rule, bool uses_device_library) {
    GeneratedKernel kernel{.role = role,
                           .name = name,
                           .entry_point = entry_point,
                           .source = source,
                           .uses_device_library = uses_device_library,
                           .block = block,
                           .dynamic_shared_bytes = dynamic_shared_bytes,
                           .grid_rule = grid_rule,
                           .key = {}};
    // The key hashes the headers too: a changed device library is a different kernel.
    kernel.key = attentionKernelKey(request.ir_fingerprint, variant, set.plan, request.input, request.arch, entry_point,
                                    selfContainedSource(kernel));
    set.kernels.push_back(std::move(kernel));
  };
  for (const codegen::PrologueKernel &kernel : set.prologue.kernels)
    add(AttentionKernelRole::prologue, kernel.name, kernel.entry_point, kernel.source,
        {static_cast<unsigned>(kernel.block_threads), 1, 1}, kernel.dynamic_shared_bytes, kernel.grid_rule, false);
  const auto &block = set.attention.block_dim;
  add(AttentionKernelRole::attention, set.attention.name, set.attention.entry_point, set.attention.source,
      {static_cast<unsigned>(block[0]), static_cast<unsigned>(block[1]), static_cast<unsigned>(block[2])},
      set.attention.dynamic_shared_bytes, set.attention.grid_description, set.attention.uses_device_library);
  return set;
}

std::string selfContainedSource(const GeneratedKernel &kernel) {
  return kernel.uses_device_library ? codegen::expandDeviceIncludes(kernel.source) : kernel.source;
}

CacheResult cacheKernel(KernelCache &cache, const GeneratedKernel &kernel, double *compile_milliseconds) {
  return cache.getOrBuild(kernel.key, [&] {
    const auto start = std::chrono::steady_clock::now();
    CompileRequest request;
    request.key = kernel.name + " [" + kernel.key.digest().substr(0, 16) + "]";
    request.source = kernel.source;
    request.source_name = kernel.name + ".cu";
    request.options.arch = kernel.key.arch;
    if (kernel.uses_device_library)
      for (const codegen::DeviceHeader &header : codegen::deviceLibrary())
        request.headers.emplace_back(std::string(header.name), std::string(header.text));
    ByteBuffer built = NvrtcCompiler().compileCubin(request).image;
    if (compile_milliseconds)
      *compile_milliseconds =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    return built;
  });
}

} // namespace sage::runtime
