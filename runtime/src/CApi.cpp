// The C ABI (sage/sage_c.h) over AttentionRunner. Status codes come from exception types; every exception, of any
// type, is caught here; enum values from the caller are checked before use.
#include "sage/sage_c.h"
#include "sage/sage_merge_c.h"
#include "sage/sage_sla_c.h"

#include "HeadDimChoice.h"

#include "sage/dsl/AttentionBackward.h"
#include "sage/dsl/Presets.h"
#include "sage/ir/Program.h"
#include "sage/runtime/ArgumentError.h"
#include "sage/runtime/AttentionBackwardRunner.h"
#include "sage/runtime/AttentionCall.h"
#include "sage/runtime/AttentionRunner.h"
#include "sage/runtime/CApiArguments.h"
#include "sage/runtime/CudaDriver.h"
#include "sage/runtime/CudaError.h"
#include "sage/runtime/DeviceArch.h"
#include "sage/runtime/KernelKey.h"
#include "sage/runtime/MergeRunner.h"
#include "sage/runtime/NvrtcCompiler.h"
#include "sage/runtime/SlaRunner.h"
#include "sage/runtime/VarlenCall.h"
#include "sage/schedules/ScheduleRegistry.h"
#include "sage/schedules/UnsupportedError.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>

struct sage_attention {
  std::unique_ptr<sage::runtime::AttentionRunner> runner;
};

struct sage_sla {
  std::unique_ptr<sage::runtime::SlaRunner> runner;
  int device = 0;
  sage::runtime::DataType dtype = sage::runtime::DataType::f16; // config.dtype
};

struct sage_backward {
  std::unique_ptr<sage::runtime::AttentionBackwardRunner> runner;
  sage_dtype dtype = SAGE_DTYPE_F16;
  int device = 0;
};

namespace {

using sage::runtime::ArgumentError;
using sage::runtime::capi::describe;

thread_local std::string last_error;

sage_status fail(sage_status status, const char *message) {
  try {
    last_error = message;
  } catch (...) { // no memory for the message: the status still says what happened
  }
  return status;
}

// Runs `body`, mapping each exception type to its status. The order matters: derived types first.
template <typename Body> sage_status guarded(Body &&body) noexcept {
  try {
    body();
    last_error.clear();
    return SAGE_OK;
  } catch (const sage::schedules::UnsupportedError &error) {
    return fail(SAGE_UNSUPPORTED, error.what());
  } catch (const sage::ir::ProgramError &error) {
    return fail(SAGE_INVALID_ARGUMENT, error.what());
  } catch (const sage::runtime::CompileError &error) {
    return fail(SAGE_COMPILE_ERROR, error.what());
  } catch (const sage::runtime::CudaError &error) {
    return fail(SAGE_CUDA_ERROR, error.what());
  } catch (const std::invalid_argument &error) { // ArgumentError and the layers' own argument checks
    return fail(SAGE_INVALID_ARGUMENT, error.what());
  } catch (const std::bad_alloc &) {
    return fail(SAGE_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception &error) {
    return fail(SAGE_INTERNAL_ERROR, (std::string("internal error: ") + error.what()).c_str());
  } catch (...) {
    return fail(SAGE_INTERNAL_ERROR, "internal error: an unknown exception");
  }
}

sage::schedules::InputType inputTypeOf(int dtype) {
  if (dtype == SAGE_DTYPE_F16)
    return sage::schedules::InputType::f16;
  if (dtype == SAGE_DTYPE_BF16)
    return sage::schedules::InputType::bf16;
  throw ArgumentError("config.dtype", "expected SAGE_DTYPE_F16 or SAGE_DTYPE_BF16, got " + std::to_string(dtype));
}

sage::runtime::TensorLayout layoutOf(int layout) {
  if (layout == SAGE_LAYOUT_HND)
    return sage::runtime::TensorLayout::hnd;
  if (layout == SAGE_LAYOUT_NHD)
    return sage::runtime::TensorLayout::nhd;
  throw ArgumentError("layout", "expected SAGE_LAYOUT_HND or SAGE_LAYOUT_NHD, got " + std::to_string(layout));
}

sage::runtime::CausalAlignment causalAlignmentOf(int alignment) {
  if (alignment == SAGE_CAUSAL_BOTTOM_RIGHT)
    return sage::runtime::CausalAlignment::bottom_right;
  if (alignment == SAGE_CAUSAL_TOP_LEFT)
    return sage::runtime::CausalAlignment::top_left;
  throw ArgumentError("causal_alignment",
                      "expected SAGE_CAUSAL_BOTTOM_RIGHT or SAGE_CAUSAL_TOP_LEFT, got " + std::to_string(alignment));
}

sage::runtime::AttentionRunner &runnerOf(sage_attention_t attention) {
  if (!attention || !attention->runner)
    throw ArgumentError("attention", "must be a handle from sage_attention_create");
  return *attention->runner;
}

sage::ir::Program programOf(const sage_attention_config &config) {
  if (config.ir_text) {
    if (config.preset)
      throw ArgumentError("config", "give preset or ir_text, not both");
    return sage::ir::Program::parse(config.ir_text, "<sage_attention_config.ir_text>");
  }
  if (!config.preset)
    throw ArgumentError("config", "preset or ir_text must be given");
  const std::string name = config.preset;
  if (config.head_dim <= 0)
    throw ArgumentError("config.head_dim", "must be positive, got " + std::to_string(config.head_dim));
  auto builder =
      sage::dsl::preset(name, config.head_dim, config.causal ? sage::MaskKind::causal : sage::MaskKind::none);
  if (!builder)
    throw ArgumentError("config.preset", "unknown preset '" + name + "' (`sagegen list` lists them)");
  builder->lse(config.write_lse != 0);
  return builder->build();
}

// SLA (sage_sla_c.h): the tensors are contiguous, of one dtype, on the SLA object's device.
sage::runtime::SlaRunner &slaRunnerOf(sage_sla_t sla) {
  if (!sla || !sla->runner)
    throw ArgumentError("sla", "must be a handle from sage_sla_create");
  return *sla->runner;
}

sage::runtime::capi::SlaRequirements slaRequirementsOf(sage_sla_t sla) {
  return {slaRunnerOf(sla).variant().head_dim, sla->device, sla->dtype};
}

// sage_sla_forward and sage_sla_backward: the arguments checked by `validate`, the workspace checked, then
// `pass(runner, validated, stream)`.
template <class Validate, class Pass>
sage_status runSlaPass(sage_sla_t sla, const sage_sla_args *args, Validate validate, Pass pass) {
  return guarded([&] {
    const sage::runtime::SlaRunner &runner = slaRunnerOf(sla);
    if (!args)
      throw ArgumentError("args", "must not be null");
    const auto validated = validate(*args, slaRequirementsOf(sla));
    sage::runtime::checkWorkspace(validated.regions, args->workspace, args->workspace_bytes,
                                  runner.workspaceBytes(validated.shape, true), 256, "sage_sla_workspace");
    pass(runner, validated, static_cast<sage::runtime::driver::Stream>(args->stream));
  });
}

// ---- SageBwd (issue 12) -------------------------------------------------------------------------------------------
sage::runtime::AttentionBackwardRunner &backwardOf(sage_backward_t backward) {
  if (!backward || !backward->runner)
    throw ArgumentError("backward", "must be a handle from sage_backward_create");
  return *backward->runner;
}

sage::runtime::capi::BackwardRequirements backwardRequirementsOf(const sage_backward &backward) {
  return {backward.runner->plan().head_dim, sage::runtime::capi::dataTypeOf(backward.dtype, "config.dtype"),
          backward.device};
}

sage::runtime::RunPhase phaseOf(int phase) {
  switch (phase) {
  case SAGE_PHASE_ALL:
    return sage::runtime::RunPhase::all;
  case SAGE_PHASE_PROLOGUE:
    return sage::runtime::RunPhase::prologue;
  case SAGE_PHASE_ATTENTION:
    return sage::runtime::RunPhase::attention;
  default:
    throw ArgumentError("phase", "expected SAGE_PHASE_ALL, SAGE_PHASE_PROLOGUE or SAGE_PHASE_ATTENTION, got " +
                                     std::to_string(phase));
  }
}

// What sage_run_args and sage_varlen_args share: q, k, v, o, the optional lse and the causal alignment.
template <class Args, class Call> void describeCall(const Args &args, Call &call) {
  call.q = describe(args.q, "q");
  call.k = describe(args.k, "k");
  call.v = describe(args.v, "v");
  call.o = describe(args.o, "o");
  if (args.lse)
    call.lse = describe(args.lse, "lse");
  call.causal_alignment = causalAlignmentOf(args.causal_alignment);
}

// A validated dense or packed call on `runner` with the arguments' workspace and stream (the workspace is checked
// against the call's plan: one plan lookup). `sizing`: the entry point that gives the workspace's size.
template <class Args>
void runValidated(const sage::runtime::AttentionRunner &runner, const sage::runtime::ValidatedCall &validated,
                  const Args &args, sage::runtime::RunPhase phase, const char *sizing) {
  runner.run(validated, args.workspace, args.workspace_bytes, static_cast<sage::runtime::driver::Stream>(args.stream),
             phase, sizing);
}

// The *_create functions' first checks: `out` given and set to null before anything can fail (clearOut), then `config`
// given.
template <class Handle> void clearOut(Handle *out) {
  if (!out)
    throw ArgumentError("out", "must not be null");
  *out = nullptr;
}

template <class Config, class Handle> void checkCreateArguments(const Config *config, Handle *out) {
  clearOut(out);
  if (!config)
    throw ArgumentError("config", "must not be null");
}

// The *_describe functions: `text` into the caller's buffer, cut to fit, NUL-terminated.
void copyDescription(const std::string &text, char *buffer, size_t buffer_bytes) {
  if (!buffer || buffer_bytes == 0)
    throw ArgumentError("buffer", "must not be null or empty");
  const size_t length = std::min(text.size(), buffer_bytes - 1);
  std::memcpy(buffer, text.data(), length);
  buffer[length] = '\0';
}

} // namespace

extern "C" {

int sage_abi_version(void) { return SAGE_ABI_VERSION; }

const char *sage_last_error(void) { return last_error.c_str(); }

const char *sage_version(void) { return sage::runtime::sagegenVersion(); }

sage_status sage_attention_create(const sage_attention_config *config, sage_attention_t *out) {
  return guarded([&] {
    checkCreateArguments(config, out);
    const sage::ir::Program program = programOf(*config);
    const sage::AttentionVariant variant = program.variant();
    sage::runtime::AttentionRunnerOptions options;
    options.input = inputTypeOf(config->dtype);
    options.ir_fingerprint = program.fingerprint();
    options.device = config->device;
    if (config->tunables && *config->tunables) {
      try {
        sage::schedules::parseTunables(config->tunables, sage::schedules::defaultTunables(variant)); // GPU or not
      } catch (const std::invalid_argument &error) {
        throw ArgumentError("config.tunables", error.what());
      }
      // Fields left out keep the schedule's defaults on the device's arch, as without any tunables.
      const sage::runtime::CudaDriver &driver = sage::runtime::CudaDriver::instance();
      if (!driver.available())
        throw sage::runtime::CudaError("cuInit", 0, "no CUDA driver or device: " + driver.status().reason);
      if (config->device < 0 || config->device >= driver.status().device_count)
        throw ArgumentError("config.device", "expected a CUDA device ordinal from 0 to " +
                                                 std::to_string(driver.status().device_count - 1) + ", got " +
                                                 std::to_string(config->device));
      sage::runtime::ScopedContext scope(driver, driver.primaryContext(config->device));
      options.arch = sage::runtime::currentDeviceArch();
      options.tunables = sage::schedules::parseTunables(
          config->tunables, sage::schedules::scheduledDefaultTunables(variant, *options.arch, options.input));
    }
    auto handle = std::make_unique<sage_attention>();
    handle->runner = std::make_unique<sage::runtime::AttentionRunner>(variant, options);
    *out = handle.release();
  });
}

void sage_attention_destroy(sage_attention_t attention) { delete attention; }

sage_status sage_attention_workspace_bytes(sage_attention_t attention, sage_layout layout, const sage_tensor_desc *q,
                                           const sage_tensor_desc *k, size_t *bytes) {
  return guarded([&] {
    const sage::runtime::AttentionRunner &runner = runnerOf(attention);
    if (!bytes)
      throw ArgumentError("bytes", "must not be null");
    sage::runtime::AttentionCall call;
    call.layout = layoutOf(layout);
    call.q = describe(q, "q");
    call.k = describe(k, "k");
    *bytes = runner.workspaceBytes(call);
  });
}

sage_status sage_attention_head_dim(const char *preset, int head_dim, long long tokens_kv, int capability,
                                    sage_dtype dtype, int block_mask, int *run_head_dim) {
  return guarded([&] {
    if (!preset)
      throw ArgumentError("preset", "must not be null");
    if (!run_head_dim)
      throw ArgumentError("run_head_dim", "must not be null");
    if (capability < 10 || capability > 999)
      throw ArgumentError("capability", "expected major * 10 + minor (e.g. 90), got " + std::to_string(capability));
    if (dtype != 0 && dtype != SAGE_DTYPE_F16 && dtype != SAGE_DTYPE_BF16)
      throw ArgumentError("dtype", "expected SAGE_DTYPE_F16, SAGE_DTYPE_BF16 or 0 (f16), got " + std::to_string(dtype));
    sage::runtime::HeadDimRequest request;
    request.preset = preset;
    request.head_dim = head_dim;
    request.tokens_kv = tokens_kv;
    try {
      request.arch = sage::schedules::archFromComputeCapability(capability / 10, capability % 10);
    } catch (const std::invalid_argument &) { // a GPU sagegen has no kernels for: the runner refuses it, saying why
      *run_head_dim = head_dim;
      return;
    }
    request.input = dtype == SAGE_DTYPE_BF16 ? sage::schedules::InputType::bf16 : sage::schedules::InputType::f16;
    request.block_mask = block_mask != 0;
    const char *forced = std::getenv("SAGEGEN_SCHEDULE"); // as AttentionRunner reads it
    request.schedule = forced ? forced : "";
    *run_head_dim = sage::runtime::runHeadDim(request);
  });
}

sage_status sage_attention_block_sizes(sage_attention_t attention, int *block_q, int *block_kv) {
  return guarded([&] {
    const sage::runtime::AttentionRunner &runner = runnerOf(attention);
    if (!block_q || !block_kv)
      throw ArgumentError("block_q, block_kv", "must not be null");
    *block_q = runner.requirements().block_q;
    *block_kv = runner.requirements().block_kv;
  });
}

sage_status sage_attention_run(sage_attention_t attention, const sage_run_args *args) {
  return guarded([&] {
    const sage::runtime::AttentionRunner &runner = runnerOf(attention);
    if (!args)
      throw ArgumentError("args", "must not be null");
    sage::runtime::AttentionCall call;
    call.layout = layoutOf(args->layout);
    describeCall(*args, call);
    if (args->block_mask)
      call.block_mask = describe(args->block_mask, "block_mask");
    const sage::runtime::RunPhase phase = phaseOf(args->phase);
    runValidated(runner, sage::runtime::validateAttentionCall(call, runner.requirements()), *args, phase,
                 "sage_attention_workspace_bytes");
  });
}

sage_status sage_attention_varlen_workspace_bytes(sage_attention_t attention, long long batch, long long heads_q,
                                                  long long heads_kv, long long max_seqlen_q, long long max_seqlen_kv,
                                                  size_t *bytes) {
  return guarded([&] {
    const sage::runtime::AttentionRunner &runner = runnerOf(attention);
    if (!bytes)
      throw ArgumentError("bytes", "must not be null");
    *bytes = runner.varlenWorkspaceBytes(batch, heads_q, heads_kv, max_seqlen_q, max_seqlen_kv);
  });
}

sage_status sage_attention_run_varlen(sage_attention_t attention, const sage_varlen_args *args) {
  return guarded([&] {
    const sage::runtime::AttentionRunner &runner = runnerOf(attention);
    if (!args)
      throw ArgumentError("args", "must not be null");
    sage::runtime::VarlenCall call;
    describeCall(*args, call);
    call.cu_seqlens_q = describe(args->cu_seqlens_q, "cu_seqlens_q");
    call.cu_seqlens_kv = describe(args->cu_seqlens_kv, "cu_seqlens_kv");
    call.max_seqlen_q = args->max_seqlen_q;
    call.max_seqlen_kv = args->max_seqlen_kv;
    const sage::runtime::AttentionRunner &packed = runner.packedRunner(); // SAGE_UNSUPPORTED where none runs it
    runValidated(packed, sage::runtime::validateVarlenCall(call, packed.requirements()), *args,
                 sage::runtime::RunPhase::all, "sage_attention_varlen_workspace_bytes");
  });
}

sage_status sage_attention_describe(sage_attention_t attention, char *buffer, size_t buffer_bytes) {
  return guarded([&] {
    const sage::runtime::AttentionRunner &runner = runnerOf(attention);
    copyDescription(runner.describe(), buffer, buffer_bytes);
  });
}

sage_status sage_sla_create(const sage_sla_config *config, sage_sla_t *out) {
  return guarded([&] {
    clearOut(out);
    if (!config || !config->preset)
      throw ArgumentError("config", "must not be null and must name a preset");
    auto builder = sage::dsl::preset(config->preset, config->head_dim);
    if (!builder || !builder->describe().sla.enabled)
      throw ArgumentError("config.preset",
                          std::string("expected an SLA preset (sla-f16, sla-int8, sla-f16-elu), got '") +
                              config->preset + "'");
    builder->sla(sage::runtime::capi::slaSpecOf(*config, builder->describe().sla));
    const sage::runtime::DataType dtype = sage::runtime::capi::slaDataTypeOf(config->dtype);
    const sage::ir::Program program = builder->build(); // the verifier checks k_h and k_l
    sage::runtime::AttentionRunnerOptions options;
    options.ir_fingerprint = sage::dsl::emitProgram(sage::slaSparsePart(program.variant())).fingerprint();
    options.device = config->device;
    options.input =
        dtype == sage::runtime::DataType::bf16 ? sage::schedules::InputType::bf16 : sage::schedules::InputType::f16;
    auto handle = std::make_unique<sage_sla>();
    handle->runner = std::make_unique<sage::runtime::SlaRunner>(program.variant(), options);
    handle->device = config->device;
    handle->dtype = dtype;
    *out = handle.release();
  });
}

void sage_sla_destroy(sage_sla_t sla) { delete sla; }

sage_status sage_sla_workspace(sage_sla_t sla, const sage_tensor_desc *q, const sage_tensor_desc *k, size_t *bytes,
                               size_t *classes_offset, int *q_blocks, int *kv_blocks) {
  return guarded([&] {
    const sage::runtime::SlaRunner &runner = slaRunnerOf(sla);
    if (!bytes || !classes_offset || !q_blocks || !kv_blocks)
      throw ArgumentError("bytes, classes_offset, q_blocks, kv_blocks", "must not be null");
    const sage::schedules::ProblemShape shape = sage::runtime::capi::validateSlaInputs(q, k, slaRequirementsOf(sla));
    const sage::runtime::SlaWorkspaceLayout layout = runner.workspaceLayout(shape, true);
    *bytes = layout.total;
    *classes_offset = layout.classes;
    *q_blocks = layout.shape.q_blocks;
    *kv_blocks = layout.shape.kv_blocks;
  });
}

sage_status sage_sla_forward(sage_sla_t sla, const sage_sla_args *args) {
  return runSlaPass(sla, args, sage::runtime::capi::validateSlaForwardArgs,
                    [&](const sage::runtime::SlaRunner &runner, const auto &validated, auto stream) {
                      runner.run(validated.shape, validated.tensors, args->workspace, args->workspace_bytes, stream);
                    });
}

sage_status sage_sla_backward(sage_sla_t sla, const sage_sla_args *args) {
  return runSlaPass(sla, args, sage::runtime::capi::validateSlaBackwardArgs,
                    [&](const sage::runtime::SlaRunner &runner, const auto &validated, auto stream) {
                      runner.backward(validated.shape, validated.tensors, args->workspace, args->workspace_bytes,
                                      stream);
                    });
}

// ---- SageBwd (issue 12) -------------------------------------------------------------------------------------------
sage_status sage_backward_create(const sage_backward_config *config, sage_backward_t *out) {
  return guarded([&] {
    checkCreateArguments(config, out);
    const std::string name = config->preset ? config->preset : "sagebwd";
    if (config->head_dim <= 0)
      throw ArgumentError("config.head_dim", "must be positive, got " + std::to_string(config->head_dim));
    const sage::schedules::InputType input = inputTypeOf(config->dtype);
    auto builder = sage::dsl::backwardPreset(name, config->head_dim,
                                             config->causal ? sage::MaskKind::causal : sage::MaskKind::none);
    if (!builder)
      throw ArgumentError("config.preset", "unknown backward preset '" + name + "' (`sagegen list` lists them)");
    builder->float_type(input == sage::schedules::InputType::bf16 ? sage::ElementType::bf16 : sage::ElementType::f16);
    const sage::ir::BackwardProgram program = builder->build();
    auto handle = std::make_unique<sage_backward>();
    sage::runtime::BackwardRunnerOptions options;
    options.ir_fingerprint = program.fingerprint();
    handle->runner =
        std::make_unique<sage::runtime::AttentionBackwardRunner>(program.variant(), input, config->device, options);
    handle->dtype = config->dtype;
    handle->device = config->device;
    *out = handle.release();
  });
}

void sage_backward_destroy(sage_backward_t backward) { delete backward; }

sage_status sage_backward_workspace_bytes(sage_backward_t backward, const sage_tensor_desc *q,
                                          const sage_tensor_desc *k, size_t *bytes) {
  return guarded([&] {
    const sage::runtime::AttentionBackwardRunner &runner = backwardOf(backward);
    if (!bytes)
      throw ArgumentError("bytes", "must not be null");
    const sage::runtime::capi::BackwardShape shape =
        sage::runtime::capi::validateBackwardInputs(q, k, backwardRequirementsOf(*backward));
    *bytes = runner.workspaceBytes(shape.batch, shape.heads_q, shape.heads_kv, shape.tokens_q, shape.tokens_kv);
  });
}

sage_status sage_backward_run(sage_backward_t backward, const sage_backward_args *args) {
  return guarded([&] {
    const sage::runtime::AttentionBackwardRunner &runner = backwardOf(backward);
    if (!args)
      throw ArgumentError("args", "must not be null");
    const sage::runtime::capi::ValidatedBackward validated =
        sage::runtime::capi::validateBackwardArgs(*args, backwardRequirementsOf(*backward));
    const sage::runtime::BackwardTensors &tensors = validated.tensors;
    sage::runtime::checkWorkspace(
        validated.regions, args->workspace, args->workspace_bytes,
        runner.workspaceBytes(tensors.batch, tensors.heads_q, tensors.heads_kv, tensors.tokens_q, tensors.tokens_kv),
        256, "sage_backward_workspace_bytes");
    runner.run(tensors, args->workspace, args->workspace_bytes,
               static_cast<sage::runtime::driver::Stream>(args->stream));
  });
}

sage_status sage_backward_describe(sage_backward_t backward, char *buffer, size_t buffer_bytes) {
  return guarded([&] {
    const sage::runtime::AttentionBackwardRunner &runner = backwardOf(backward);
    copyDescription(runner.describe(), buffer, buffer_bytes);
  });
}

// ---- LSE merge (issue 30) ----------------------------------------------------------------------------------------
sage_status sage_merge_attention(const sage_merge_args *args) {
  return guarded([&] {
    if (!args)
      throw ArgumentError("args", "must not be null");
    sage::runtime::MergeCall call;
    call.layout = layoutOf(args->layout);
    call.o_a = describe(args->o_a, "o_a");
    call.lse_a = describe(args->lse_a, "lse_a");
    call.o_b = describe(args->o_b, "o_b");
    call.lse_b = describe(args->lse_b, "lse_b");
    call.o_out = describe(args->o_out, "o_out");
    call.lse_out = describe(args->lse_out, "lse_out");
    const sage::runtime::ValidatedMerge merge = sage::runtime::validateMergeCall(call);
    sage::runtime::runMerge(merge, static_cast<sage::runtime::driver::Stream>(args->stream));
  });
}

} // extern "C"
