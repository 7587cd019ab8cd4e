// The tuning database file: schema, validation, lookup and the locked, atomic merge.
#include "sage/runtime/TuningDatabase.h"

#include "CacheFiles.h"

#include "sage/runtime/CudaDriver.h"
#include "sage/runtime/KernelCache.h"
#include "sage/runtime/KernelKey.h"
#include "sage/runtime/OutputPath.h"

#include <fmt/core.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <system_error>
#include <tuple>

namespace sage::runtime {
namespace {

constexpr std::string_view kFormat = "sagegen-tuning-db";
constexpr int kFormatVersion = 1;

double positiveNumber(const JsonValue &object, std::string_view key, const std::string &where) {
  const std::string what = where + "." + std::string(key);
  const double value = requiredMember(object, key, where).asNumber(what);
  if (!(value > 0.0) || !std::isfinite(value))
    throw JsonError(what + ": expected a positive number of milliseconds");
  return value;
}

constexpr int64_t kMaxTokens = int64_t(1) << 40;
constexpr size_t kMaxNameBytes = 128;

// A preset name or an IR fingerprint: short, and made of the characters those use.
void checkVariantName(const std::string &name, const std::string &what) {
  if (name.size() > kMaxNameBytes ||
      name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") != std::string::npos)
    throw JsonError(what + ": expected a preset name or an IR fingerprint (at most 128 of [A-Za-z0-9_.-]), got \"" +
                    name + "\"");
}

// tunablesText's format: block_q, block_kv, warps and stages, each once, as positive integers, and optionally
// inline_loads (0 or 1) and ctas (a positive integer) (the runtime's core does not link the schedules, so this checks
// the form; the schedule checks the values when it applies them).
void checkTunablesText(const std::string &text, const std::string &what) {
  constexpr std::string_view kNames[] = {"block_q", "block_kv", "warps", "stages", "inline_loads", "ctas"};
  constexpr size_t kRequired = 4, kNameCount = 6, kFlag = 4; // kNames[kFlag] is 0 or 1, the others positive
  bool seen[kNameCount] = {false, false, false, false, false, false};
  std::string_view rest = text;
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const size_t equals = item.find('=');
    const std::string_view name = item.substr(0, equals);
    size_t index = 0;
    while (index < kNameCount && kNames[index] != name)
      ++index;
    const std::string_view digits = equals == std::string_view::npos ? std::string_view() : item.substr(equals + 1);
    const bool valid = index != kFlag ? !digits.empty() && digits.size() <= 4 &&
                                            digits.find_first_not_of("0123456789") == std::string_view::npos &&
                                            digits.front() != '0'
                                      : digits == "0" || digits == "1";
    if (index == kNameCount || seen[index] || !valid)
      throw JsonError(what +
                      ": expected \"block_q=B,block_kv=B,warps=W,stages=S\" (each once, positive integers; "
                      "optionally \",inline_loads=0|1\" and \",ctas=C\"), got \"" +
                      text + "\"");
    seen[index] = true;
    if (comma == std::string_view::npos)
      break;
    rest = rest.substr(comma + 1);
  }
  for (size_t index = 0; index < kRequired; ++index)
    if (!seen[index])
      throw JsonError(what + ": expected all of block_q, block_kv, warps and stages, got \"" + text + "\"");
}

TuningEntry entryFromJson(const JsonValue &json, const std::string &where) {
  json.asObject(where);
  TuningEntry entry;
  entry.variant = requiredNonEmptyString(json, "variant", where);
  checkVariantName(entry.variant, where + ".variant");
  const int64_t head_dim = requiredMember(json, "head_dim", where).asInteger(where + ".head_dim");
  if (head_dim < 16 || head_dim > 256 || head_dim % 16 != 0)
    throw JsonError(fmt::format("{}.head_dim: expected a multiple of 16 in [16, 256], got {}", where, head_dim));
  entry.head_dim = static_cast<int>(head_dim);
  entry.causal = requiredMember(json, "causal", where).asBool(where + ".causal");
  entry.input = requiredNonEmptyString(json, "input", where);
  if (entry.input != "f16" && entry.input != "bf16")
    throw JsonError(where + ".input: expected \"f16\" or \"bf16\", got \"" + entry.input + "\"");
  entry.tokens = requiredMember(json, "tokens", where).asInteger(where + ".tokens");
  if (entry.tokens <= 0 || entry.tokens > kMaxTokens)
    throw JsonError(fmt::format("{}.tokens: expected an integer in [1, 2^40], got {}", where, entry.tokens));
  entry.tunables = requiredNonEmptyString(json, "tunables", where);
  checkTunablesText(entry.tunables, where + ".tunables");
  entry.milliseconds = positiveNumber(json, "milliseconds", where);
  entry.default_milliseconds = positiveNumber(json, "default_milliseconds", where);
  entry.date = requiredNonEmptyString(json, "date", where);
  if (entry.date.size() > 64)
    throw JsonError(where + ".date: expected an ISO 8601 UTC time, got " + std::to_string(entry.date.size()) +
                    " characters");
  return entry;
}

JsonValue entryToJson(const TuningEntry &entry) {
  JsonValue json = JsonValue::object();
  json.set("variant", entry.variant);
  json.set("head_dim", entry.head_dim);
  json.set("causal", entry.causal);
  json.set("input", entry.input);
  json.set("tokens", static_cast<long long>(entry.tokens));
  json.set("tunables", entry.tunables);
  json.set("milliseconds", entry.milliseconds);
  json.set("default_milliseconds", entry.default_milliseconds);
  json.set("date", entry.date);
  return json;
}

} // namespace

bool TuningEntry::sameKey(const TuningEntry &other) const {
  return variant == other.variant && head_dim == other.head_dim && causal == other.causal && input == other.input &&
         tokens == other.tokens;
}

std::filesystem::path TuningDatabase::defaultPath() {
  if (const char *path = std::getenv("SAGEGEN_TUNING_DB"); path && *path)
    return path;
  const std::filesystem::path cache = KernelCache::defaultCacheDirectory();
  return cache.empty() ? cache : cache / "tuning.json";
}

TuningDatabase TuningDatabase::fromJson(const JsonValue &json, std::string_view source) {
  const std::string file(source);
  try {
    json.asObject("the database");
    const JsonValue *format = json.find("format");
    if (!format || !format->isString() || format->asString() != kFormat)
      throw JsonError("\"format\": expected \"" + std::string(kFormat) + "\"");
    const int64_t version = requiredMember(json, "version", "the database").asInteger("version");
    if (version != kFormatVersion)
      throw JsonError(
          fmt::format("\"version\": this sagegen reads version {}, the file has {}", kFormatVersion, version));
    TuningDatabase database;
    const JsonValue::Array &devices = requiredMember(json, "devices", "the database").asArray("devices");
    // A file that store() wrote lists each device once and each key once per device; anything else is malformed.
    // Both are found through ordered sets, so loading stays O(n log n) however many entries the file holds.
    std::map<std::tuple<std::string, std::string, std::string>, size_t> device_index;
    for (size_t i = 0; i < devices.size(); ++i) {
      const std::string where = fmt::format("devices[{}]", i);
      devices[i].asObject(where);
      TuningGroup group;
      group.device.gpu = requiredNonEmptyString(devices[i], "gpu", where);
      group.device.arch = requiredNonEmptyString(devices[i], "arch", where);
      group.device.sagegen_version = requiredNonEmptyString(devices[i], "sagegen_version", where);
      const auto [found, added] =
          device_index.emplace(std::tuple{group.device.gpu, group.device.arch, group.device.sagegen_version}, i);
      if (!added)
        throw JsonError(fmt::format("{}: the same gpu, arch and sagegen_version as devices[{}]", where, found->second));
      const JsonValue::Array &entries = requiredMember(devices[i], "entries", where).asArray(where + ".entries");
      std::map<std::tuple<std::string, int, bool, std::string, int64_t>, size_t> keys;
      for (size_t e = 0; e < entries.size(); ++e) {
        const std::string entry_where = fmt::format("{}.entries[{}]", where, e);
        TuningEntry entry = entryFromJson(entries[e], entry_where);
        const auto [same, fresh] =
            keys.emplace(std::tuple{entry.variant, entry.head_dim, entry.causal, entry.input, entry.tokens}, e);
        if (!fresh)
          throw JsonError(fmt::format("{}: the same variant, head_dim, causal, input and tokens as {}.entries[{}]",
                                      entry_where, where, same->second));
        group.entries.push_back(std::move(entry));
      }
      database.groups_.push_back(std::move(group));
    }
    return database;
  } catch (const JsonError &error) {
    throw TuningDatabaseError(file + ": " + error.what());
  }
}

TuningDatabase TuningDatabase::read(const std::filesystem::path &path) {
  if (path.empty())
    return {};
  cache_files::ReadResult file = cache_files::readWholeFile(path);
  if (file.outcome == cache_files::ReadOutcome::missing)
    return {};
  if (file.outcome == cache_files::ReadOutcome::failed)
    throw TuningDatabaseError(path.string() + ": " + file.error);
  JsonValue json;
  try {
    json = parseJson(std::string_view(reinterpret_cast<const char *>(file.bytes.data()), file.bytes.size()));
  } catch (const JsonError &error) {
    throw TuningDatabaseError(path.string() + ": " + error.what());
  }
  return fromJson(json, path.string());
}

JsonValue TuningDatabase::toJson() const {
  JsonValue json = JsonValue::object();
  json.set("format", kFormat);
  json.set("version", kFormatVersion);
  JsonValue devices = JsonValue::array();
  for (const TuningGroup &group : groups_) {
    JsonValue device = JsonValue::object();
    device.set("gpu", group.device.gpu);
    device.set("arch", group.device.arch);
    device.set("sagegen_version", group.device.sagegen_version);
    JsonValue entries = JsonValue::array();
    for (const TuningEntry &entry : group.entries)
      entries.push(entryToJson(entry));
    device.set("entries", std::move(entries));
    devices.push(std::move(device));
  }
  json.set("devices", std::move(devices));
  return json;
}

void TuningDatabase::put(const TuningDevice &device, TuningEntry entry) {
  for (TuningGroup &group : groups_) {
    if (!(group.device == device))
      continue;
    for (TuningEntry &existing : group.entries)
      if (existing.sameKey(entry)) {
        existing = std::move(entry);
        return;
      }
    group.entries.push_back(std::move(entry));
    return;
  }
  groups_.push_back({device, {std::move(entry)}});
}

std::optional<TuningEntry> TuningDatabase::lookup(const TuningQuery &query) const {
  const TuningEntry *best = nullptr;
  auto named = [&](const std::string &variant) {
    for (const std::string &name : query.variant_names)
      if (!name.empty() && name == variant)
        return true;
    return false;
  };
  auto better = [&](const TuningEntry &candidate) {
    if (!best)
      return true;
    if (query.tokens_hint <= 0)
      return candidate.tokens > best->tokens;
    const int64_t distance = std::llabs(candidate.tokens - query.tokens_hint);
    const int64_t best_distance = std::llabs(best->tokens - query.tokens_hint);
    return distance < best_distance || (distance == best_distance && candidate.tokens > best->tokens);
  };
  for (const TuningGroup &group : groups_) {
    if (!(group.device == query.device))
      continue;
    for (const TuningEntry &entry : group.entries)
      if (named(entry.variant) && entry.head_dim == query.head_dim && entry.causal == query.causal &&
          entry.input == query.input && better(entry))
        best = &entry;
  }
  return best ? std::optional<TuningEntry>(*best) : std::nullopt;
}

void TuningDatabase::store(const std::filesystem::path &path, const TuningDevice &device,
                           const std::vector<TuningEntry> &entries, std::vector<std::string> &warnings) {
  if (path.empty())
    throw TuningDatabaseError("no tuning database path: set $SAGEGEN_TUNING_DB, $SAGEGEN_CACHE_DIR or $HOME");
  for (size_t index = 0; index < entries.size(); ++index) // nothing is written that the reader would refuse
    try {
      entryFromJson(entryToJson(entries[index]), fmt::format("entries[{}]", index));
    } catch (const JsonError &error) {
      throw TuningDatabaseError(path.string() + ": not stored: " + error.what());
    }
  // Before the lock and the read: a FIFO or device at the path would otherwise be "corrupt" and moved aside.
  if (std::optional<std::string> problem = outputPathProblem(path))
    throw TuningDatabaseError(*problem);
  if (path.has_parent_path())
    if (std::optional<std::string> error = cache_files::prepareWritableDirectory(path.parent_path()))
      throw TuningDatabaseError(path.string() + ": " + *error);
  cache_files::ExclusiveFileLock lock(path.string() + ".lock");
  if (!lock.locked())
    throw TuningDatabaseError(path.string() + ": cannot lock: " + lock.error());
  TuningDatabase database;
  try {
    database = read(path);
  } catch (const TuningDatabaseError &error) {
    const std::filesystem::path aside = path.string() + ".corrupt";
    std::error_code code;
    std::filesystem::rename(path, aside, code);
    if (code)
      throw TuningDatabaseError(std::string(error.what()) + "; and it cannot be moved aside to " + aside.string() +
                                ": " + code.message());
    warnings.push_back(std::string(error.what()) + "; moved it to " + aside.string() + " and started a new database");
  }
  for (const TuningEntry &entry : entries)
    database.put(device, entry);
  const std::string text = writeJson(database.toJson()) + "\n";
  if (std::optional<std::string> error = cache_files::writeFileAtomically(path, bytesOf(text)))
    throw TuningDatabaseError(path.string() + ": " + *error);
}

TuningDevice currentTuningDevice(const std::string &arch) {
  const CudaDriver &driver = CudaDriver::instance();
  driver.ensureContext();
  return {driver.deviceName(driver.currentDevice()), arch, sagegenVersion()};
}

std::string utcTimestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

} // namespace sage::runtime
