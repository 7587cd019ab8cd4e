// What identifies one compiled kernel: everything that changes the generated source or the compiler's output.
// The key's canonical text is stored in every disk entry; its SHA-256 names the entry.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace sage::runtime {

// Version of the key's text form and of the disk entry layout built on it: bump it when either changes.
inline constexpr int kKernelKeyFormatVersion = 1;

struct KernelKey {
  std::string ir_hash;  // fingerprint of the variant's normalized IR
  std::string schedule; // schedule name, e.g. "sm80.mma_sync"
  std::string tunables; // canonical "name=value" list, e.g. "warps=4,stages=2,block_q=128"
  int head_dim = 0;
  bool causal = false;
  std::string dtypes;           // storage types, e.g. "qkv=f16,o=f16"
  std::string layout;           // "HND" or "NHD"
  std::string arch;             // "sm_90a"
  std::string compiler_version; // nvrtcVersion()
  std::string sagegen_version;  // sagegenVersion()
  std::string extra;            // anything else that changes the kernel (free form)

  // One "name=value" line per field, in a fixed order, after a header line with the format version. Values are
  // escaped (\\, \n) so that distinct keys always have distinct texts.
  std::string text() const;
  // Lower-case hex SHA-256 of text(): 64 characters, stable across runs, machines and builds.
  std::string digest() const;

  bool operator==(const KernelKey &) const = default;
};

// The inverse of KernelKey::text(): nullopt unless `text` is exactly such a text (this format version, every field
// once, in order). For tools that show what a stored key was for (`sagegen cache ls`, AOT manifests).
std::optional<KernelKey> parseKernelKeyText(std::string_view text);

// The project version baked in at configure time, e.g. "0.1.0".
const char *sagegenVersion();

} // namespace sage::runtime
