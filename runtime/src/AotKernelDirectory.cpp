#include "sage/runtime/AotKernelDirectory.h"

#include "CacheFiles.h"
#include "sage/runtime/Sha256.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>

namespace sage::runtime {
namespace {

constexpr std::string_view kWarningPrefix = "sagegen AOT kernels: ";
constexpr unsigned kElfMachineCuda = 190; // EM_CUDA

} // namespace

std::string_view nameOf(AotLookupOutcome outcome) {
  switch (outcome) {
  case AotLookupOutcome::found:
    return "found";
  case AotLookupOutcome::no_manifest:
    return "no_manifest";
  case AotLookupOutcome::not_listed:
    return "not_listed";
  case AotLookupOutcome::no_cubin:
    return "no_cubin";
  case AotLookupOutcome::rejected:
    return "rejected";
  }
  return "unknown";
}

std::optional<std::string> cudaElfProblem(ByteSpan image) {
  if (image.size() < 64 || image[0] != 0x7f || image[1] != 'E' || image[2] != 'L' || image[3] != 'F')
    return "not an ELF image";
  if (image[4] != 2 || image[5] != 1)
    return "not a 64-bit little-endian ELF image";
  unsigned machine = unsigned(image[18]) | unsigned(image[19]) << 8;
  if (machine != kElfMachineCuda)
    return fmt::format("an ELF image for machine {}, not CUDA ({})", machine, kElfMachineCuda);
  return std::nullopt;
}

std::filesystem::path AotKernelDirectory::defaultDirectory() {
  const char *value = std::getenv("SAGEGEN_AOT_DIR");
  return value != nullptr ? std::filesystem::path(value) : std::filesystem::path();
}

AotKernelDirectory::AotKernelDirectory(std::filesystem::path directory, CacheWarningSink warning_sink)
    : directory_(std::move(directory)), warning_sink_(std::move(warning_sink)) {
  if (!warning_sink_)
    warning_sink_ = [](const std::string &message) { std::fprintf(stderr, "warning: %s\n", message.c_str()); };
  try {
    manifest_ = loadAotManifest(directory_);
  } catch (const AotManifestError &error) {
    problem_ = error.what();
    warning_sink_(fmt::format("{}{}; compiling every kernel at run time instead", kWarningPrefix, problem_));
  }
}

AotLookup AotKernelDirectory::decline(AotLookupOutcome outcome, std::string reason, bool warn) const {
  if (warn)
    warning_sink_(fmt::format("{}{}; compiling it at run time instead", kWarningPrefix, reason));
  return {outcome, {}, std::move(reason)};
}

AotLookup AotKernelDirectory::find(const KernelKey &key, std::optional<bool> packed) const {
  if (!manifest_)
    return decline(AotLookupOutcome::no_manifest, problem_, false);
  const std::string key_text = key.text();
  const std::string digest = sha256Hex(key_text);
  const AotKernelEntry *entry = manifest_->find(digest);
  if (!entry)
    return decline(AotLookupOutcome::not_listed,
                   fmt::format("no kernel with key digest {} in {}", digest.substr(0, 16), directory_.string()), false);
  const std::string name = fmt::format("kernel {} ({})", entry->entry_point, digest.substr(0, 16));
  if (entry->key_text != key_text)
    return decline(AotLookupOutcome::rejected,
                   fmt::format("{}: the manifest's key text differs from the requested key", name), true);
  if (packed && entry->packed != *packed) {
    const auto kind = [](bool is_packed) { return is_packed ? "packed (variable-length)" : "dense"; };
    return decline(AotLookupOutcome::rejected,
                   fmt::format("{}: the manifest lists a {} kernel, the call needs a {} one", name, kind(entry->packed),
                               kind(*packed)),
                   true);
  }
  if (entry->cubin_file.empty())
    return decline(AotLookupOutcome::no_cubin, fmt::format("{}: emitted without a cubin", name), false);

  const std::filesystem::path path = directory_ / entry->cubin_file;
  cache_files::ReadResult read = cache_files::readWholeFile(path);
  if (read.outcome != cache_files::ReadOutcome::read)
    return decline(AotLookupOutcome::rejected,
                   fmt::format("{}: {}", name,
                               read.outcome == cache_files::ReadOutcome::missing
                                   ? fmt::format("{} is missing", path.string())
                                   : read.error),
                   true);
  if (sha256Hex(read.bytes) != entry->cubin_sha256)
    return decline(AotLookupOutcome::rejected,
                   fmt::format("{}: {} is damaged (its SHA-256 differs from the manifest's)", name, path.string()),
                   true);
  if (std::optional<std::string> problem = cudaElfProblem(read.bytes))
    return decline(AotLookupOutcome::rejected, fmt::format("{}: {} is {}", name, path.string(), *problem), true);
  return {AotLookupOutcome::found, std::move(read.bytes), {}};
}

} // namespace sage::runtime
