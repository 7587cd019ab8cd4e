// The C ABI (sage/sage_c.h) over AttentionRunner: errors become status codes plus a per-thread message.
#include "sage/sage_c.h"

#include "sage/dsl/Presets.h"
#include "sage/ir/Program.h"
#include "sage/runtime/AttentionRunner.h"
#include "sage/runtime/CudaError.h"
#include "sage/runtime/DeviceArch.h"
#include "sage/runtime/KernelKey.h"
#include "sage/runtime/NvrtcCompiler.h"

#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>

struct sage_attention {
  std::unique_ptr<sage::runtime::AttentionRunner> runner;
};

namespace {

thread_local std::string last_error;

sage_status fail(sage_status status, const std::string &message) {
  last_error = message;
  return status;
}

// Runs `body`, mapping each error family to its status.
template <typename Body> sage_status guarded(Body &&body) {
  try {
    body();
    last_error.clear();
    return SAGE_OK;
  } catch (const sage::ir::ProgramError &error) {
    return fail(SAGE_INVALID_ARGUMENT, error.what());
  } catch (const sage::runtime::CompileError &error) {
    return fail(SAGE_COMPILE_ERROR, error.what());
  } catch (const sage::runtime::CudaError &error) {
    return fail(SAGE_CUDA_ERROR, error.what());
  } catch (const std::invalid_argument &error) {
    const std::string message = error.what();
    const bool unsupported = message.find("no schedule") != std::string::npos ||
                             message.find("supports") != std::string::npos ||
                             message.find("prologue") != std::string::npos;
    return fail(unsupported ? SAGE_UNSUPPORTED : SAGE_INVALID_ARGUMENT, message);
  } catch (const std::exception &error) {
    return fail(SAGE_INTERNAL_ERROR, std::string("internal error: ") + error.what());
  }
}

sage::schedules::InputType inputTypeOf(const char *dtype) {
  const std::string text = dtype ? dtype : "";
  if (const std::optional<sage::schedules::InputType> input = sage::schedules::parseInputType(text))
    return *input;
  throw std::invalid_argument("dtype: expected \"f16\" or \"bf16\", got \"" + text + "\"");
}

sage_status create(const sage::ir::Program &program, const char *dtype, const char *tunables, sage_attention_t *out) {
  sage::runtime::AttentionRunnerOptions options;
  options.input = inputTypeOf(dtype);
  options.ir_fingerprint = program.fingerprint();
  if (tunables && *tunables) {
    const sage::AttentionVariant variant = program.variant();
    try {
      sage::schedules::parseTunables(tunables, sage::schedules::defaultTunables(variant)); // the text, GPU or not
    } catch (const std::invalid_argument &error) {
      throw std::invalid_argument(std::string("tunables: ") + error.what());
    }
    // Fields left out keep the schedule's defaults on this device's arch, as without any tunables.
    options.arch = sage::runtime::currentDeviceArch();
    options.tunables =
        sage::schedules::parseTunables(tunables, sage::schedules::defaultTunables(variant, *options.arch));
  }
  auto handle = std::make_unique<sage_attention>();
  handle->runner = std::make_unique<sage::runtime::AttentionRunner>(program.variant(), options);
  *out = handle.release();
  return SAGE_OK;
}

sage::schedules::ProblemShape problemOf(const sage_shape *shape, int head_dim) {
  if (!shape)
    throw std::invalid_argument("shape: must not be null");
  return {shape->batch, shape->heads_q, shape->heads_kv, shape->tokens_q, shape->tokens_kv, head_dim};
}

SageTensorStrides stridesOf(const sage_tensor &tensor) {
  return {tensor.batch_stride, tensor.head_stride, tensor.token_stride};
}

} // namespace

extern "C" {

const char *sage_last_error(void) { return last_error.c_str(); }

const char *sage_version(void) { return sage::runtime::sagegenVersion(); }

sage_status sage_attention_create_preset(const char *preset, int head_dim, int causal, int write_lse, const char *dtype,
                                         sage_attention_t *out) {
  return sage_attention_create_preset_tuned(preset, head_dim, causal, write_lse, dtype, nullptr, out);
}

sage_status sage_attention_create_preset_tuned(const char *preset, int head_dim, int causal, int write_lse,
                                               const char *dtype, const char *tunables, sage_attention_t *out) {
  return guarded([&] {
    if (!out)
      throw std::invalid_argument("out: must not be null");
    const std::string name = preset ? preset : "";
    auto builder = sage::dsl::preset(name, head_dim, causal ? sage::MaskKind::causal : sage::MaskKind::none);
    if (!builder)
      throw std::invalid_argument("preset: unknown preset '" + name + "'");
    builder->lse(write_lse != 0);
    create(builder->build(), dtype, tunables, out);
  });
}

sage_status sage_attention_create_ir(const char *ir_text, const char *dtype, sage_attention_t *out) {
  return guarded([&] {
    if (!out || !ir_text)
      throw std::invalid_argument("ir_text, out: must not be null");
    create(sage::ir::Program::parse(ir_text, "<sage_attention_create_ir>"), dtype, nullptr, out);
  });
}

void sage_attention_destroy(sage_attention_t attention) { delete attention; }

sage_status sage_attention_workspace_bytes(sage_attention_t attention, const sage_shape *shape, size_t *bytes) {
  return guarded([&] {
    if (!attention || !bytes)
      throw std::invalid_argument("attention, bytes: must not be null");
    *bytes = attention->runner->workspaceBytes(problemOf(shape, attention->runner->variant().head_dim));
  });
}

sage_status sage_attention_run(sage_attention_t attention, sage_phase phase, const sage_shape *shape, sage_tensor q,
                               sage_tensor k, sage_tensor v, sage_tensor o, float *lse, const unsigned char *block_mask,
                               void *workspace, size_t workspace_bytes, void *stream) {
  return guarded([&] {
    if (!attention)
      throw std::invalid_argument("attention: must not be null");
    sage::runtime::AttentionTensors tensors;
    tensors.q = q.data;
    tensors.k = k.data;
    tensors.v = v.data;
    tensors.o = o.data;
    tensors.q_strides = stridesOf(q);
    tensors.k_strides = stridesOf(k);
    tensors.v_strides = stridesOf(v);
    tensors.o_strides = stridesOf(o);
    tensors.lse = lse;
    tensors.block_mask = block_mask;
    const auto run_phase = phase == SAGE_PHASE_PROLOGUE    ? sage::runtime::RunPhase::prologue
                           : phase == SAGE_PHASE_ATTENTION ? sage::runtime::RunPhase::attention
                                                           : sage::runtime::RunPhase::all;
    attention->runner->run(problemOf(shape, attention->runner->variant().head_dim), tensors, workspace, workspace_bytes,
                           static_cast<sage::runtime::driver::Stream>(stream), run_phase);
  });
}

sage_status sage_attention_describe(sage_attention_t attention, char *buffer, size_t buffer_bytes) {
  return guarded([&] {
    if (!attention || !buffer || buffer_bytes == 0)
      throw std::invalid_argument("attention, buffer: must not be null or empty");
    const std::string text = attention->runner->describe();
    const size_t length = std::min(text.size(), buffer_bytes - 1);
    std::memcpy(buffer, text.data(), length);
    buffer[length] = '\0';
  });
}

} // extern "C"
