// The C ABI (sage/sage_c.h) over AttentionRunner. Status codes come from exception types; every exception, of any
// type, is caught here; enum values from the caller are checked before use.
#include "sage/sage_c.h"
#include "sage/sage_sla_c.h"

#include "sage/dsl/AttentionBackward.h"
#include "sage/dsl/Presets.h"
#include "sage/ir/Program.h"
#include "sage/runtime/ArgumentError.h"
#include "sage/runtime/AttentionBackwardRunner.h"
#include "sage/runtime/AttentionCall.h"
#include "sage/runtime/AttentionRunner.h"
#include "sage/runtime/CudaDriver.h"
#include "sage/runtime/CudaError.h"
#include "sage/runtime/DeviceArch.h"
#include "sage/runtime/KernelKey.h"
#include "sage/runtime/NvrtcCompiler.h"
#include "sage/runtime/SlaRunner.h"
#include "sage/schedules/ScheduleRegistry.h"
#include "sage/schedules/UnsupportedError.h"

#include <algorithm>
#include <cmath>
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
};

struct sage_backward {
  std::unique_ptr<sage::runtime::AttentionBackwardRunner> runner;
  sage_dtype dtype = SAGE_DTYPE_F16;
  int device = 0;
};

namespace {

using sage::runtime::ArgumentError;

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

sage::runtime::DataType dataTypeOf(int dtype, const char *argument) {
  switch (dtype) {
  case SAGE_DTYPE_F16:
    return sage::runtime::DataType::f16;
  case SAGE_DTYPE_BF16:
    return sage::runtime::DataType::bf16;
  case SAGE_DTYPE_F32:
    return sage::runtime::DataType::f32;
  case SAGE_DTYPE_U8:
    return sage::runtime::DataType::u8;
  case SAGE_DTYPE_BOOL:
    return sage::runtime::DataType::boolean;
  }
  throw ArgumentError(argument, "unknown sage_dtype value " + std::to_string(dtype));
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

sage::runtime::TensorDescription describe(const sage_tensor_desc &tensor, const char *argument) {
  if (tensor.ndim < 1 || tensor.ndim > sage::runtime::kMaxTensorRank)
    throw ArgumentError(argument, "ndim must be 1 to 4, got " + std::to_string(tensor.ndim));
  sage::runtime::TensorDescription description;
  description.data = tensor.data;
  description.rank = tensor.ndim;
  for (int i = 0; i < tensor.ndim; ++i) {
    description.shape[i] = tensor.shape[i];
    description.strides[i] = tensor.strides[i];
  }
  description.dtype = dataTypeOf(tensor.dtype, argument);
  description.device = tensor.device;
  return description;
}

const sage_tensor_desc &required(const sage_tensor_desc *tensor, const char *argument) {
  if (!tensor)
    throw ArgumentError(argument, "must not be null");
  return *tensor;
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

// Checks a 4-D contiguous tensor of `dtype` and `shape` on `device`; returns its data pointer.
void *contiguousData(const sage_tensor_desc *tensor, const char *argument, int dtype, const long long (&shape)[4],
                     int device) {
  const sage_tensor_desc &t = required(tensor, argument);
  if (t.ndim != 4)
    throw ArgumentError(argument, "expected 4 dimensions, got " + std::to_string(t.ndim));
  if (t.dtype != dtype)
    throw ArgumentError(argument, std::string("expected dtype ") + (dtype == SAGE_DTYPE_F16 ? "f16" : "f32") +
                                      ", got sage_dtype " + std::to_string(t.dtype));
  if (t.device != device)
    throw ArgumentError(argument, "expected device " + std::to_string(device) + ", got " + std::to_string(t.device));
  if (!t.data)
    throw ArgumentError(argument, "data must not be null");
  long long stride = 1;
  for (int i = 3; i >= 0; --i) {
    if (t.shape[i] != shape[i])
      throw ArgumentError(argument, "expected shape [" + std::to_string(shape[0]) + ", " + std::to_string(shape[1]) +
                                        ", " + std::to_string(shape[2]) + ", " + std::to_string(shape[3]) + "]");
    if (t.strides[i] != stride)
      throw ArgumentError(argument, "must be contiguous: expected stride " + std::to_string(stride) +
                                        " (elements) in dimension " + std::to_string(i) + ", got " +
                                        std::to_string(t.strides[i]));
    stride *= shape[i];
  }
  return t.data;
}

struct SlaProblem {
  sage::schedules::ProblemShape shape;
  long long q_shape[4], kv_shape[4];
};

SlaProblem slaProblemOf(const sage::runtime::SlaRunner &runner, const sage_tensor_desc *q, const sage_tensor_desc *k) {
  const sage_tensor_desc &q_desc = required(q, "q"), &k_desc = required(k, "k");
  if (q_desc.ndim != 4 || k_desc.ndim != 4)
    throw ArgumentError("q, k", "expected 4-D HND tensors [batch, heads, tokens, head_dim]");
  SlaProblem problem;
  problem.shape = {q_desc.shape[0], q_desc.shape[1], k_desc.shape[1],
                   q_desc.shape[2], k_desc.shape[2], q_desc.shape[3]};
  for (int i = 0; i < 4; ++i) {
    problem.q_shape[i] = q_desc.shape[i];
    problem.kv_shape[i] = k_desc.shape[i];
  }
  if (k_desc.shape[0] != q_desc.shape[0] || k_desc.shape[3] != q_desc.shape[3])
    throw ArgumentError("k", "batch and head_dim must equal q's");
  if (q_desc.shape[3] != runner.variant().head_dim)
    throw ArgumentError("q", "head_dim must be the SLA object's " + std::to_string(runner.variant().head_dim));
  for (long long size : q_desc.shape)
    if (size <= 0 || size > (1LL << 30))
      throw ArgumentError("q", "sizes must lie in [1, 2^30]");
  for (long long size : k_desc.shape)
    if (size <= 0 || size > (1LL << 30))
      throw ArgumentError("k", "sizes must lie in [1, 2^30]");
  return problem;
}

SageTensorStrides contiguousStrides(const long long (&shape)[4]) {
  return {shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3]};
}

// ---- SageBwd (issue 12) -------------------------------------------------------------------------------------------
sage::runtime::AttentionBackwardRunner &backwardOf(sage_backward_t backward) {
  if (!backward || !backward->runner)
    throw ArgumentError("backward", "must be a handle from sage_backward_create");
  return *backward->runner;
}

// A contiguous tensor of `shape` (rank 3 or 4) and `dtype` on `device`, 16-byte aligned.
void checkContiguous(const sage_tensor_desc *tensor, const char *argument, std::initializer_list<long long> shape,
                     int dtype, int device) {
  const sage_tensor_desc &t = required(tensor, argument);
  if (t.ndim != static_cast<int>(shape.size()))
    throw ArgumentError(argument,
                        "expected " + std::to_string(shape.size()) + " dimensions, got " + std::to_string(t.ndim));
  long long stride = 1;
  int axis = static_cast<int>(shape.size()) - 1;
  for (auto it = shape.end(); it != shape.begin(); --axis) {
    --it;
    if (t.shape[axis] != *it)
      throw ArgumentError(argument, "dimension " + std::to_string(axis) + " must be " + std::to_string(*it) + ", got " +
                                        std::to_string(t.shape[axis]));
    if (t.strides[axis] != stride && *it > 1)
      throw ArgumentError(argument, "must be contiguous (HND): stride " + std::to_string(axis) + " must be " +
                                        std::to_string(stride) + ", got " + std::to_string(t.strides[axis]));
    stride *= *it;
  }
  if (t.dtype != dtype)
    throw ArgumentError(argument,
                        "dtype must be " + std::to_string(dtype) + " (sage_dtype), got " + std::to_string(t.dtype));
  if (t.device != device)
    throw ArgumentError(argument, "must be on device " + std::to_string(device) + ", got " + std::to_string(t.device));
  if (!t.data || reinterpret_cast<uintptr_t>(t.data) % 16 != 0)
    throw ArgumentError(argument, "data must be a non-null, 16-byte aligned device pointer");
}

void checkShapeDims(const sage_tensor_desc &tensor, const char *argument) {
  if (tensor.ndim != 4)
    throw ArgumentError(argument,
                        "expected 4 dimensions [batch, heads, tokens, head_dim], got " + std::to_string(tensor.ndim));
}

} // namespace

extern "C" {

int sage_abi_version(void) { return SAGE_ABI_VERSION; }

const char *sage_last_error(void) { return last_error.c_str(); }

const char *sage_version(void) { return sage::runtime::sagegenVersion(); }

sage_status sage_attention_create(const sage_attention_config *config, sage_attention_t *out) {
  return guarded([&] {
    if (!out)
      throw ArgumentError("out", "must not be null");
    *out = nullptr;
    if (!config)
      throw ArgumentError("config", "must not be null");
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
    call.q = describe(required(q, "q"), "q");
    call.k = describe(required(k, "k"), "k");
    *bytes = runner.workspaceBytes(call);
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
    call.q = describe(required(args->q, "q"), "q");
    call.k = describe(required(args->k, "k"), "k");
    call.v = describe(required(args->v, "v"), "v");
    call.o = describe(required(args->o, "o"), "o");
    if (args->lse)
      call.lse = describe(*args->lse, "lse");
    if (args->block_mask)
      call.block_mask = describe(*args->block_mask, "block_mask");
    if (args->causal_alignment == SAGE_CAUSAL_BOTTOM_RIGHT)
      call.causal_alignment = sage::runtime::CausalAlignment::bottom_right;
    else if (args->causal_alignment == SAGE_CAUSAL_TOP_LEFT)
      call.causal_alignment = sage::runtime::CausalAlignment::top_left;
    else
      throw ArgumentError("causal_alignment", "expected SAGE_CAUSAL_BOTTOM_RIGHT or SAGE_CAUSAL_TOP_LEFT, got " +
                                                  std::to_string(args->causal_alignment));
    sage::runtime::RunPhase phase = sage::runtime::RunPhase::all;
    switch (args->phase) {
    case SAGE_PHASE_ALL:
      break;
    case SAGE_PHASE_PROLOGUE:
      phase = sage::runtime::RunPhase::prologue;
      break;
    case SAGE_PHASE_ATTENTION:
      phase = sage::runtime::RunPhase::attention;
      break;
    default:
      throw ArgumentError("phase", "expected SAGE_PHASE_ALL, SAGE_PHASE_PROLOGUE or SAGE_PHASE_ATTENTION, got " +
                                       std::to_string(args->phase));
    }
    runner.run(call, args->workspace, args->workspace_bytes, static_cast<sage::runtime::driver::Stream>(args->stream),
               phase);
  });
}

sage_status sage_attention_describe(sage_attention_t attention, char *buffer, size_t buffer_bytes) {
  return guarded([&] {
    const sage::runtime::AttentionRunner &runner = runnerOf(attention);
    if (!buffer || buffer_bytes == 0)
      throw ArgumentError("buffer", "must not be null or empty");
    const std::string text = runner.describe();
    const size_t length = std::min(text.size(), buffer_bytes - 1);
    std::memcpy(buffer, text.data(), length);
    buffer[length] = '\0';
  });
}

sage_status sage_sla_create(const sage_sla_config *config, sage_sla_t *out) {
  return guarded([&] {
    if (!out)
      throw ArgumentError("out", "must not be null");
    *out = nullptr;
    if (!config || !config->preset)
      throw ArgumentError("config", "must not be null and must name a preset");
    auto builder = sage::dsl::preset(config->preset, config->head_dim);
    if (!builder || !builder->describe().sla.enabled)
      throw ArgumentError("config.preset",
                          std::string("expected an SLA preset (sla-f16, sla-int8, sla-f16-elu), got '") +
                              config->preset + "'");
    sage::SlaSpec spec = builder->describe().sla;
    if (config->critical_percent > 0)
      spec.critical_percent = config->critical_percent;
    if (config->negligible_percent >= 0)
      spec.negligible_percent = config->negligible_percent;
    if (config->feature_map >= 0) {
      if (config->feature_map > 2)
        throw ArgumentError("config.feature_map", "expected 0 (softmax), 1 (elu + 1), 2 (relu) or -1");
      spec.feature_map = static_cast<sage::FeatureMap>(config->feature_map);
    }
    builder->sla(spec);
    const sage::ir::Program program = builder->build(); // the verifier checks k_h and k_l
    sage::runtime::AttentionRunnerOptions options;
    options.ir_fingerprint = sage::dsl::emitProgram(sage::slaSparsePart(program.variant())).fingerprint();
    options.device = config->device;
    auto handle = std::make_unique<sage_sla>();
    handle->runner = std::make_unique<sage::runtime::SlaRunner>(program.variant(), options);
    handle->device = config->device;
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
    const SlaProblem problem = slaProblemOf(runner, q, k);
    const sage::runtime::SlaWorkspaceLayout layout = runner.workspaceLayout(problem.shape, true);
    *bytes = layout.total;
    *classes_offset = layout.classes;
    *q_blocks = layout.shape.q_blocks;
    *kv_blocks = layout.shape.kv_blocks;
  });
}

sage_status sage_sla_forward(sage_sla_t sla, const sage_sla_args *args) {
  return guarded([&] {
    const sage::runtime::SlaRunner &runner = slaRunnerOf(sla);
    if (!args)
      throw ArgumentError("args", "must not be null");
    const SlaProblem problem = slaProblemOf(runner, args->q, args->k);
    const int device = sla->device;
    sage::runtime::SlaTensors tensors;
    tensors.q = contiguousData(args->q, "q", SAGE_DTYPE_F16, problem.q_shape, device);
    tensors.k = contiguousData(args->k, "k", SAGE_DTYPE_F16, problem.kv_shape, device);
    tensors.v = contiguousData(args->v, "v", SAGE_DTYPE_F16, problem.kv_shape, device);
    tensors.o = contiguousData(args->o_sparse, "o_sparse", SAGE_DTYPE_F16, problem.q_shape, device);
    tensors.o_linear =
        static_cast<float *>(contiguousData(args->o_linear, "o_linear", SAGE_DTYPE_F32, problem.q_shape, device));
    tensors.q_strides = tensors.o_strides = contiguousStrides(problem.q_shape);
    tensors.k_strides = tensors.v_strides = contiguousStrides(problem.kv_shape);
    const size_t needed = runner.workspaceBytes(problem.shape, true);
    if (!args->workspace || args->workspace_bytes < needed)
      throw ArgumentError("workspace", std::to_string(needed) + " bytes needed (sage_sla_workspace)");
    runner.run(problem.shape, tensors, args->workspace, args->workspace_bytes,
               static_cast<sage::runtime::driver::Stream>(args->stream));
  });
}

sage_status sage_sla_backward(sage_sla_t sla, const sage_sla_args *args) {
  return guarded([&] {
    const sage::runtime::SlaRunner &runner = slaRunnerOf(sla);
    if (!args)
      throw ArgumentError("args", "must not be null");
    const SlaProblem problem = slaProblemOf(runner, args->q, args->k);
    const int device = sla->device;
    sage::runtime::SlaBackwardTensors tensors;
    tensors.q = contiguousData(args->q, "q", SAGE_DTYPE_F16, problem.q_shape, device);
    tensors.k = contiguousData(args->k, "k", SAGE_DTYPE_F16, problem.kv_shape, device);
    tensors.v = contiguousData(args->v, "v", SAGE_DTYPE_F16, problem.kv_shape, device);
    tensors.q_strides = contiguousStrides(problem.q_shape);
    tensors.k_strides = tensors.v_strides = contiguousStrides(problem.kv_shape);
    tensors.d_sparse =
        static_cast<const float *>(contiguousData(args->d_sparse, "d_sparse", SAGE_DTYPE_F32, problem.q_shape, device));
    tensors.d_linear =
        static_cast<const float *>(contiguousData(args->d_linear, "d_linear", SAGE_DTYPE_F32, problem.q_shape, device));
    tensors.dq = static_cast<float *>(contiguousData(args->dq, "dq", SAGE_DTYPE_F32, problem.q_shape, device));
    tensors.dk = static_cast<float *>(contiguousData(args->dk, "dk", SAGE_DTYPE_F32, problem.kv_shape, device));
    tensors.dv = static_cast<float *>(contiguousData(args->dv, "dv", SAGE_DTYPE_F32, problem.kv_shape, device));
    if (args->o_sparse) { // optional: the forward's O^s, so that a saved L spares the statistics kernel
      tensors.o_sparse = contiguousData(args->o_sparse, "o_sparse", SAGE_DTYPE_F16, problem.q_shape, device);
      tensors.o_sparse_strides = contiguousStrides(problem.q_shape);
    }
    const size_t needed = runner.workspaceBytes(problem.shape, true);
    if (!args->workspace || args->workspace_bytes < needed)
      throw ArgumentError("workspace", std::to_string(needed) + " bytes needed (sage_sla_workspace)");
    runner.backward(problem.shape, tensors, args->workspace, args->workspace_bytes,
                    static_cast<sage::runtime::driver::Stream>(args->stream));
  });
}

// ---- SageBwd (issue 12) -------------------------------------------------------------------------------------------
sage_status sage_backward_create(const sage_backward_config *config, sage_backward_t *out) {
  return guarded([&] {
    if (!out)
      throw ArgumentError("out", "must not be null");
    *out = nullptr;
    if (!config)
      throw ArgumentError("config", "must not be null");
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
    checkShapeDims(required(q, "q"), "q");
    checkShapeDims(required(k, "k"), "k");
    *bytes = runner.workspaceBytes(q->shape[0], q->shape[1], k->shape[1], q->shape[2], k->shape[2]);
  });
}

sage_status sage_backward_run(sage_backward_t backward, const sage_backward_args *args) {
  return guarded([&] {
    const sage::runtime::AttentionBackwardRunner &runner = backwardOf(backward);
    if (!args)
      throw ArgumentError("args", "must not be null");
    const sage_tensor_desc &q = required(args->q, "q"), &k = required(args->k, "k");
    checkShapeDims(q, "q");
    checkShapeDims(k, "k");
    const long long batch = q.shape[0], heads_q = q.shape[1], tokens_q = q.shape[2], d = q.shape[3];
    const long long heads_kv = k.shape[1], tokens_kv = k.shape[2];
    if (d != runner.plan().head_dim)
      throw ArgumentError("q",
                          "head_dim must be " + std::to_string(runner.plan().head_dim) + ", got " + std::to_string(d));
    const int dtype = backward->dtype, device = backward->device;
    for (auto [tensor, name] :
         {std::pair{args->q, "q"}, std::pair{args->o, "o"}, std::pair{args->d_o, "d_o"}, std::pair{args->d_q, "d_q"}})
      checkContiguous(tensor, name, {batch, heads_q, tokens_q, d}, dtype, device);
    for (auto [tensor, name] :
         {std::pair{args->k, "k"}, std::pair{args->v, "v"}, std::pair{args->d_k, "d_k"}, std::pair{args->d_v, "d_v"}})
      checkContiguous(tensor, name, {batch, heads_kv, tokens_kv, d}, dtype, device);
    checkContiguous(args->lse, "lse", {batch, heads_q, tokens_q}, SAGE_DTYPE_F32, device);
    if (!(args->softmax_scale >= 0.0f) || !std::isfinite(args->softmax_scale))
      throw ArgumentError("softmax_scale", "must be 0 (1 / sqrt(head_dim)) or a positive finite number");
    sage::runtime::BackwardTensors tensors;
    tensors.q = q.data;
    tensors.k = k.data;
    tensors.v = args->v->data;
    tensors.o = args->o->data;
    tensors.d_o = args->d_o->data;
    tensors.lse = static_cast<const float *>(args->lse->data);
    tensors.d_q = args->d_q->data;
    tensors.d_k = args->d_k->data;
    tensors.d_v = args->d_v->data;
    tensors.batch = batch;
    tensors.heads_q = heads_q;
    tensors.heads_kv = heads_kv;
    tensors.tokens_q = tokens_q;
    tensors.tokens_kv = tokens_kv;
    tensors.softmax_scale = args->softmax_scale;
    runner.run(tensors, args->workspace, args->workspace_bytes,
               static_cast<sage::runtime::driver::Stream>(args->stream));
  });
}

sage_status sage_backward_describe(sage_backward_t backward, char *buffer, size_t buffer_bytes) {
  return guarded([&] {
    const sage::runtime::AttentionBackwardRunner &runner = backwardOf(backward);
    if (!buffer || buffer_bytes == 0)
      throw ArgumentError("buffer", "must not be null or empty");
    const std::string text = runner.describe();
    const size_t length = std::min(text.size(), buffer_bytes - 1);
    std::memcpy(buffer, text.data(), length);
    buffer[length] = '\0';
  });
}

} // extern "C"
