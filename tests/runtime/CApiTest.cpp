// The C ABI's boundary without a GPU: status codes by the kind of error, messages naming the argument, unknown
// enum values refused, nothing thrown across. (tests/gpu and python/tests run it on a GPU.)
#include "sage/sage_c.h"

#include "sage/runtime/CudaDriver.h"

#include <doctest/doctest.h>

#include <string>

extern "C" int sage_test_header_abi_version(void);

namespace {

sage_attention_config presetConfig() {
  sage_attention_config config{};
  config.preset = "sage-b";
  config.head_dim = 64;
  config.dtype = SAGE_DTYPE_F16;
  config.device = 0;
  return config;
}

std::string lastError() { return sage_last_error(); }

} // namespace

TEST_CASE("the library and the header agree on the ABI version, also from C") {
  CHECK(sage_abi_version() == SAGE_ABI_VERSION);
  CHECK(sage_test_header_abi_version() == SAGE_ABI_VERSION);
}

TEST_CASE("create: null and unknown arguments are INVALID_ARGUMENT naming the argument") {
  sage_attention_t attention = nullptr;
  const sage_attention_config good = presetConfig();
  CHECK(sage_attention_create(&good, nullptr) == SAGE_INVALID_ARGUMENT);
  CHECK(lastError().rfind("out:", 0) == 0);
  CHECK(sage_attention_create(nullptr, &attention) == SAGE_INVALID_ARGUMENT);
  CHECK(lastError().rfind("config:", 0) == 0);

  sage_attention_config config = presetConfig();
  config.dtype = static_cast<sage_dtype>(42);
  CHECK(sage_attention_create(&config, &attention) == SAGE_INVALID_ARGUMENT);
  CHECK(lastError().find("config.dtype") == 0);
  config.dtype = SAGE_DTYPE_F32;
  CHECK(sage_attention_create(&config, &attention) == SAGE_INVALID_ARGUMENT);

  config = presetConfig();
  config.preset = "sage-nope";
  CHECK(sage_attention_create(&config, &attention) == SAGE_INVALID_ARGUMENT);
  CHECK(lastError().find("config.preset") == 0);
  config.preset = nullptr;
  CHECK(sage_attention_create(&config, &attention) == SAGE_INVALID_ARGUMENT);

  config = presetConfig();
  config.preset = nullptr;
  config.ir_text = "this is not sage IR";
  CHECK(sage_attention_create(&config, &attention) == SAGE_INVALID_ARGUMENT);
  CHECK(attention == nullptr);
}

TEST_CASE("create without a GPU is a CUDA error saying why, with a bad device ordinal an argument error") {
  if (sage::runtime::CudaDriver::instance().available())
    return; // the GPU tests cover the other side
  sage_attention_t attention = nullptr;
  const sage_attention_config config = presetConfig();
  CHECK(sage_attention_create(&config, &attention) == SAGE_CUDA_ERROR);
  CHECK(lastError().find("no CUDA driver or device") != std::string::npos);
  CHECK(attention == nullptr);
}

TEST_CASE("calls on a null handle or with null arguments fail cleanly") {
  sage_run_args args{};
  CHECK(sage_attention_run(nullptr, &args) == SAGE_INVALID_ARGUMENT);
  CHECK(lastError().rfind("attention:", 0) == 0);
  size_t bytes = 0;
  sage_tensor_desc q{};
  CHECK(sage_attention_workspace_bytes(nullptr, SAGE_LAYOUT_HND, &q, &q, &bytes) == SAGE_INVALID_ARGUMENT);
  int block_q = 0, block_kv = 0;
  CHECK(sage_attention_block_sizes(nullptr, &block_q, &block_kv) == SAGE_INVALID_ARGUMENT);
  char buffer[16];
  CHECK(sage_attention_describe(nullptr, buffer, sizeof buffer) == SAGE_INVALID_ARGUMENT);
  sage_attention_destroy(nullptr); // a no-op
}

TEST_CASE("varlen calls on a null handle fail cleanly, naming the handle") {
  sage_varlen_args args{};
  CHECK(sage_attention_run_varlen(nullptr, &args) == SAGE_INVALID_ARGUMENT);
  CHECK(lastError().rfind("attention:", 0) == 0);
  size_t bytes = 0;
  CHECK(sage_attention_varlen_workspace_bytes(nullptr, 2, 8, 8, 128, 128, &bytes) == SAGE_INVALID_ARGUMENT);
  CHECK(lastError().rfind("attention:", 0) == 0);
}

TEST_CASE("the error message stays until the next call; the version needs no GPU") {
  CHECK(sage_attention_run(nullptr, nullptr) == SAGE_INVALID_ARGUMENT);
  CHECK_FALSE(lastError().empty());
  CHECK(std::string(sage_version()).size() > 0);
}
