// Ahead-of-time kernels at run time: a directory written by `sagegen emit` (a manifest.json and the files it
// lists). find() answers, for one kernel key, with the cubin's bytes or with why it declined, without loading
// anything, so the whole decision is testable without a GPU. It hands out an image only when the manifest lists
// the key's digest, the stored key text equals the asked key's text, the entry is of the asked kind (packed or dense,
// where the caller says), and the cubin is intact (its SHA-256 as recorded) and a CUDA ELF image. Anything else is
// declined; a mismatch or a damaged file also warns, and the caller compiles the kernel itself (JIT through the kernel
// cache).
#pragma once

#include "sage/runtime/AotManifest.h"
#include "sage/runtime/Bytes.h"
#include "sage/runtime/KernelCache.h"
#include "sage/runtime/KernelKey.h"

#include <filesystem>
#include <optional>
#include <string>

namespace sage::runtime {

enum class AotLookupOutcome {
  found,       // image holds the cubin
  no_manifest, // the directory has no usable manifest (warned once, at construction)
  not_listed,  // the manifest has no kernel with this key's digest
  no_cubin,    // listed, but emitted as source (or PTX) only
  rejected,    // listed, but the key text or the packed flag differs, or the cubin is missing, damaged or foreign
               // (warned)
};
std::string_view nameOf(AotLookupOutcome outcome);

struct AotLookup {
  AotLookupOutcome outcome = AotLookupOutcome::not_listed;
  ByteBuffer image;   // the cubin, when found
  std::string reason; // why not, otherwise
};

class AotKernelDirectory {
public:
  // Reads `directory`/manifest.json now. A missing or invalid manifest is one warning; lookups then decline.
  explicit AotKernelDirectory(std::filesystem::path directory, CacheWarningSink warning_sink = {});

  // `packed`: the caller's kind of kernel, when it knows it (a packed variable-length variant's, or a dense one's):
  // an entry of the other kind is rejected. The key's IR fingerprint already differs between the two; this is the
  // manifest's own record agreeing with it.
  AotLookup find(const KernelKey &key, std::optional<bool> packed = std::nullopt) const;

  const std::filesystem::path &directory() const { return directory_; }
  const std::optional<AotManifest> &manifest() const { return manifest_; }
  const std::string &problem() const { return problem_; } // why there is no manifest

  // $SAGEGEN_AOT_DIR, or empty when unset.
  static std::filesystem::path defaultDirectory();

private:
  AotLookup decline(AotLookupOutcome outcome, std::string reason, bool warn) const;

  std::filesystem::path directory_;
  CacheWarningSink warning_sink_;
  std::optional<AotManifest> manifest_;
  std::string problem_;
};

// Checks that `image` is a 64-bit ELF object for the CUDA machine (EM_CUDA); returns the problem, or nothing.
std::optional<std::string> cudaElfProblem(ByteSpan image);

} // namespace sage::runtime
