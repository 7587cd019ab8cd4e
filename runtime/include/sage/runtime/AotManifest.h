// The manifest of a directory of ahead-of-time kernels (`sagegen emit` writes one `manifest.json` per output
// directory): for every kernel its cache key (text and digest), what it is (variant, schedule, tunables, arch,
// input type, entry point), its files (the .cu source, and the .ptx / .cubin when emitted), how to launch it and
// what ptxas reported. The loader validates everything and names the offending field in its errors, so a
// damaged or hand-edited manifest is rejected before anything in it is trusted.
#pragma once

#include "sage/runtime/Json.h"

#include <array>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace sage::runtime {

inline constexpr std::string_view kAotManifestSchema = "sagegen-aot-manifest";
// Bump when a field is added, removed or changes meaning; loaders accept only their own version. (The optional
// "packed" field of issue 28 did not bump it: it is written only when true, so a manifest without packed kernels is
// what version 1 always was, and a reader older than the field refuses one with packed kernels as an unknown field.)
inline constexpr int kAotManifestSchemaVersion = 1;
inline constexpr std::string_view kAotManifestFileName = "manifest.json";

class AotManifestError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

// ptxas's report for the kernel (absent when the kernel was not compiled); for a module of several kernels, the
// largest value of each field over its kernels.
struct AotKernelResources {
  int registers = 0;
  int spill_store_bytes = 0;
  int spill_load_bytes = 0;
  int static_shared_bytes = 0;
  int stack_frame_bytes = 0;
  bool operator==(const AotKernelResources &) const = default;
};

struct AotKernelEntry {
  std::string key_digest; // SHA-256 of key_text: the lookup key
  std::string key_text;   // KernelKey::text()
  std::string variant;    // the variant's name
  std::string preset;     // the preset it was built from
  int head_dim = 0;
  bool causal = false;
  bool lse = false;
  bool packed = false; // a kernel of the variant on packed variable-length sequences (`sagegen emit --packed`)
  std::string role;    // "prologue", "attention", or a module of several kernels: "backward" (SageBwd) or "sla"
  std::string name;
  std::string schedule;
  std::string tunables;
  std::string arch;        // "sm_90a"
  std::string input;       // "f16" or "bf16"
  std::string entry_point; // a backward or SLA module: the module's name (its kernels are the plan's launches)
  std::string source_file; // file names inside the manifest's directory, never paths
  std::string source_sha256;
  std::string ptx_file;   // empty when not emitted
  std::string cubin_file; // empty when not emitted
  std::string cubin_sha256;
  std::array<int, 3> block{1, 1, 1};
  std::string grid_rule;
  int dynamic_shared_bytes = 0;
  std::optional<AotKernelResources> resources;
  bool operator==(const AotKernelEntry &) const = default;
};

// A combination the generator was asked for but could not produce (e.g. FP8 P.V on sm_80), and why.
struct AotSkippedVariant {
  std::string preset;
  int head_dim = 0;
  bool causal = false;
  std::string input;
  std::string arch;
  std::string reason;
  bool packed = false; // asked for with --packed
  bool operator==(const AotSkippedVariant &) const = default;
};

struct AotManifest {
  int schema_version = kAotManifestSchemaVersion;
  int key_format_version = 0; // kKernelKeyFormatVersion of the writer
  std::string sagegen_version;
  std::string nvrtc_version; // the compiler of the cubins/PTX and of the ptxas numbers
  std::vector<AotKernelEntry> kernels;
  std::vector<AotSkippedVariant> skipped;
  bool operator==(const AotManifest &) const = default;

  const AotKernelEntry *find(std::string_view key_digest) const;
};

// The names emit gives a kernel's files, from its entry point and its source's SHA-256: "<entry point>-<first 12
// hex digits>.cu", and "<that stem>.<arch>.ptx" / ".cubin". A manifest must list exactly these names: a cubin listed
// under another entry (swapped cubin/hash pairs) or a file emit did not write is refused.
std::string aotSourceFileName(std::string_view entry_point, std::string_view source_sha256);
std::string aotImageFileName(std::string_view entry_point, std::string_view source_sha256, std::string_view arch,
                             std::string_view extension); // extension: "ptx" or "cubin"

// Validates and reads a manifest. Throws AotManifestError "<origin>: <field path>: <problem>", e.g.
// "manifest.json: kernels[3].block[1]: expected a positive integer, found -1".
AotManifest parseAotManifest(std::string_view text, std::string_view origin = kAotManifestFileName);
// Reads `directory`/manifest.json (AotManifestError when it cannot be read or is invalid).
AotManifest loadAotManifest(const std::filesystem::path &directory);

JsonValue aotManifestJson(const AotManifest &manifest);
// The manifest file's text: writeJson with 2-space indent and a final newline; deterministic.
std::string writeAotManifest(const AotManifest &manifest);

} // namespace sage::runtime
