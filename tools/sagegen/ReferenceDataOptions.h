// Options shared by the CPU reference commands (`reference`, `reference-backward`): the problem's shape, the random
// data's seed and its storage type.
#pragma once

#include "Commands.h"

#include "sage/reference/HostTensor.h"

#include <cstdint>
#include <string>

namespace sage::tool {

struct ReferenceDataOptions {
  static constexpr int64_t kMaxTokens = int64_t(1) << 24;

  int64_t tokens = 1024, kv_tokens = 0, batch = 1, heads = 1, kv_heads = 0; // 0: not given (same as Q's)
  uint64_t seed = 0;
  std::string dtype = "f16";

  // --n, --n-kv, --batch, --heads, --kv-heads, --seed and --dtype (`tensors`: what it stores, "Q, K, V").
  void addDataOptions(CLI::App &command, const std::string &tensors) {
    command.add_option("--n", tokens, "query tokens (and key tokens unless --n-kv)")
        ->capture_default_str()
        ->check(CLI::Range(int64_t(1), kMaxTokens));
    command.add_option("--n-kv", kv_tokens, "key/value tokens (default: --n)")
        ->check(CLI::Range(int64_t(1), kMaxTokens));
    command.add_option("--batch", batch, "batch size")->capture_default_str()->check(CLI::Range(1, 65535));
    command.add_option("--heads", heads, "query heads")->capture_default_str()->check(CLI::Range(1, 4096));
    command.add_option("--kv-heads", kv_heads, "key/value heads (GQA; default: --heads)")->check(CLI::Range(1, 4096));
    command.add_option("--seed", seed, "random seed")->capture_default_str();
    command.add_option("--dtype", dtype, "storage type of " + tensors + ": f16, bf16 or f32")->capture_default_str();
  }

  // --dtype as a StorageType; a UserError for anything else.
  reference::StorageType storage() const {
    if (dtype == "f16")
      return reference::StorageType::f16;
    if (dtype == "bf16")
      return reference::StorageType::bf16;
    if (dtype == "f32")
      return reference::StorageType::f32;
    throw UserError("--dtype: expected f16, bf16 or f32, got '" + dtype + "'");
  }
};

} // namespace sage::tool
