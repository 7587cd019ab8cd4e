// The tuning database: what `sagegen tune` measured, one JSON file shared by every process of a machine
// ($SAGEGEN_TUNING_DB, else <kernel cache directory>/tuning.json). Entries are grouped per (GPU name, arch,
// sagegen version) and keyed by (variant, head dim, causal, input type, N); each holds the fastest tunables, their
// time and the schedule default's time. Writes merge under a lock and replace the file atomically; a corrupt file is
// moved aside to `<path>.corrupt` with a warning, never overwritten silently.
#pragma once

#include "sage/runtime/Json.h"

#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace sage::runtime {

// A malformed database: the message names the file and the JSON position or field.
class TuningDatabaseError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

// Where the measurements were taken; tuned tunables only apply to the same GPU, arch and sagegen version.
struct TuningDevice {
  std::string gpu;             // the driver's device name, e.g. "NVIDIA H100 80GB HBM3"
  std::string arch;            // "sm_90a"
  std::string sagegen_version; // sagegenVersion()
  bool operator==(const TuningDevice &) const = default;
};

struct TuningEntry {
  std::string variant; // preset name, or the IR fingerprint of a variant that is not a preset
  int head_dim = 0;
  bool causal = false;
  std::string input;                 // "f16" or "bf16"
  int64_t tokens = 0;                // N of the measured problem
  std::string tunables;              // tunablesText of the fastest candidate
  double milliseconds = 0.0;         // its median time of one call (prologue + attention)
  double default_milliseconds = 0.0; // the schedule defaults' median time
  std::string date;                  // UTC, ISO 8601 ("2026-11-23T11:14:01Z")

  bool sameKey(const TuningEntry &other) const;
};

struct TuningGroup {
  TuningDevice device;
  std::vector<TuningEntry> entries;
};

// What a runner asks for. `variant_names`: every name the variant goes by (its preset name, its IR fingerprint).
struct TuningQuery {
  TuningDevice device;
  std::vector<std::string> variant_names;
  int head_dim = 0;
  bool causal = false;
  std::string input;
  int64_t tokens_hint = 0; // > 0: the entry whose N is closest (ties: the larger N); 0: the largest N
};

class TuningDatabase {
public:
  // $SAGEGEN_TUNING_DB, else KernelCache::defaultCacheDirectory() / "tuning.json" (empty if neither is known).
  static std::filesystem::path defaultPath();

  // A missing file is an empty database; an unreadable or malformed one throws TuningDatabaseError.
  static TuningDatabase read(const std::filesystem::path &path);
  // `source` names the file in error messages.
  static TuningDatabase fromJson(const JsonValue &json, std::string_view source);
  JsonValue toJson() const;

  const std::vector<TuningGroup> &groups() const { return groups_; }
  bool empty() const { return groups_.empty(); }

  // Adds `entry` to `device`'s group, replacing an entry with the same key.
  void put(const TuningDevice &device, TuningEntry entry);
  std::optional<TuningEntry> lookup(const TuningQuery &query) const;

  // Merges `entries` into the file at `path` under an exclusive lock (`<path>.lock`): keeps every other group and
  // key, replaces the same keys, writes a temporary file and renames it over `path`. A corrupt file is moved to
  // `<path>.corrupt` and reported in `warnings`. Throws TuningDatabaseError when the file cannot be written.
  static void store(const std::filesystem::path &path, const TuningDevice &device,
                    const std::vector<TuningEntry> &entries, std::vector<std::string> &warnings);

private:
  std::vector<TuningGroup> groups_;
};

// This process's GPU (device 0's primary context unless one is current) for `arch`, as entries are grouped. Throws
// CudaError without a driver or device.
TuningDevice currentTuningDevice(const std::string &arch);

// The current UTC time as ISO 8601, for TuningEntry::date.
std::string utcTimestamp();

} // namespace sage::runtime
