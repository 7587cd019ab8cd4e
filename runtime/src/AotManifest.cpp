#include "sage/runtime/AotManifest.h"

#include "CacheFiles.h"

#include "sage/runtime/KernelKey.h"
#include "sage/runtime/Sha256.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

namespace sage::runtime {
namespace {

bool isLowerHex(std::string_view text, size_t size) {
  return text.size() == size && text.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

// A file name inside the manifest's directory: no separators, nothing that climbs out of it.
bool isPlainFileName(std::string_view name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string_view::npos &&
         name.find('\\') == std::string_view::npos && name.find('\0') == std::string_view::npos;
}

// Reads one JSON object's fields by name, remembering which were read so that unknown fields can be rejected.
// Every error names the field by its path from the manifest's root.
class ObjectReader {
public:
  ObjectReader(const JsonValue &value, std::string path, std::string_view origin)
      : value_(value), path_(std::move(path)), origin_(origin) {
    if (!value.isObject())
      fail(path_.empty() ? "top level" : path_, fmt::format("expected an object, found {}", nameOf(value.kind())));
  }

  [[noreturn]] void fail(std::string_view field_path, std::string_view problem) const {
    throw AotManifestError(fmt::format("{}: {}: {}", origin_, field_path, problem));
  }
  std::string fieldPath(std::string_view name) const {
    return path_.empty() ? std::string(name) : fmt::format("{}.{}", path_, name);
  }

  const JsonValue *optional(std::string_view name) {
    read_.insert(std::string(name));
    return value_.find(name);
  }
  const JsonValue &required(std::string_view name) {
    const JsonValue *field = optional(name);
    if (!field)
      fail(fieldPath(name), "required field is missing");
    return *field;
  }
  const JsonValue &typed(std::string_view name, JsonValue::Kind kind, const char *expected) {
    const JsonValue &field = required(name);
    if (field.kind() != kind)
      fail(fieldPath(name), fmt::format("expected {}, found {}", expected, nameOf(field.kind())));
    return field;
  }

  std::string string(std::string_view name, bool allow_empty = false) {
    std::string text = typed(name, JsonValue::Kind::string, "a string").asString();
    if (text.empty() && !allow_empty)
      fail(fieldPath(name), "must not be empty");
    return text;
  }
  bool boolean(std::string_view name) { return typed(name, JsonValue::Kind::boolean, "a boolean").asBool(); }
  // A boolean field that may be left out (false then).
  bool optionalBoolean(std::string_view name) {
    const JsonValue *field = optional(name);
    if (!field)
      return false;
    if (!field->isBool())
      fail(fieldPath(name), fmt::format("expected a boolean, found {}", nameOf(field->kind())));
    return field->asBool();
  }
  int integer(std::string_view name, int minimum) {
    return integerOf(typed(name, JsonValue::Kind::number, "an integer"), fieldPath(name), minimum);
  }

  int integerOf(const JsonValue &value, const std::string &field_path, int minimum) const {
    if (!value.isNumber())
      fail(field_path, fmt::format("expected an integer, found {}", nameOf(value.kind())));
    // Range first: converting an out-of-range double to an integer is undefined behaviour.
    double number = value.asNumber();
    if (!(number >= minimum && number <= 1e9) || number != std::floor(number))
      fail(field_path, fmt::format("expected an integer >= {}, found {}", minimum, writeJson(value, 0)));
    return static_cast<int>(number);
  }
  // A preset name or a variant's symbol name: printable, short, no quotes or separators.
  std::string name(std::string_view field) {
    std::string text = string(field);
    if (text.size() > 128 ||
        text.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") !=
            std::string::npos)
      fail(fieldPath(field), fmt::format("expected a name of at most 128 of [A-Za-z0-9_.-], found \"{}\"", text));
    return text;
  }
  std::string hex(std::string_view name, size_t size) {
    std::string text = string(name);
    if (!isLowerHex(text, size))
      fail(fieldPath(name), fmt::format("expected {} lower-case hex digits, found \"{}\"", size, text));
    return text;
  }
  std::string fileName(std::string_view name) {
    std::string text = string(name);
    if (!isPlainFileName(text))
      fail(fieldPath(name), fmt::format("expected a file name inside the manifest's directory, found \"{}\"", text));
    return text;
  }

  void rejectUnknownFields() const {
    for (const auto &[name, value] : value_.asObject())
      if (!read_.contains(name))
        fail(fieldPath(name),
             "unknown field (not in manifest schema version " + std::to_string(kAotManifestSchemaVersion) + ")");
  }

  const std::string &path() const { return path_; }

private:
  const JsonValue &value_;
  std::string path_;
  std::string_view origin_;
  std::set<std::string, std::less<>> read_;
};

AotKernelResources readResources(const JsonValue &value, const std::string &path, std::string_view origin) {
  ObjectReader reader(value, path, origin);
  AotKernelResources resources;
  resources.registers = reader.integer("registers", 0);
  resources.spill_store_bytes = reader.integer("spill_store_bytes", 0);
  resources.spill_load_bytes = reader.integer("spill_load_bytes", 0);
  resources.static_shared_bytes = reader.integer("static_shared_bytes", 0);
  resources.stack_frame_bytes = reader.integer("stack_frame_bytes", 0);
  reader.rejectUnknownFields();
  return resources;
}

AotKernelEntry readKernel(const JsonValue &value, const std::string &path, std::string_view origin) {
  ObjectReader reader(value, path, origin);
  AotKernelEntry entry;
  entry.key_digest = reader.hex("key_digest", 64);
  entry.key_text = reader.string("key_text");
  if (sha256Hex(entry.key_text) != entry.key_digest)
    reader.fail(reader.fieldPath("key_digest"), "is not the SHA-256 of key_text");
  std::optional<KernelKey> key = parseKernelKeyText(entry.key_text);
  if (!key)
    reader.fail(reader.fieldPath("key_text"),
                fmt::format("not a kernel key text of key format version {}", kKernelKeyFormatVersion));
  entry.variant = reader.name("variant");
  entry.preset = reader.name("preset");
  entry.head_dim = reader.integer("head_dim", 16);
  if (entry.head_dim % 16 != 0 || entry.head_dim > 256)
    reader.fail(reader.fieldPath("head_dim"),
                fmt::format("expected a multiple of 16 in [16, 256], found {}", entry.head_dim));
  entry.causal = reader.boolean("causal");
  entry.lse = reader.boolean("lse");
  entry.packed = reader.optionalBoolean("packed");
  entry.role = reader.string("role");
  if (entry.role != "prologue" && entry.role != "attention" && entry.role != "backward" && entry.role != "sla")
    reader.fail(reader.fieldPath("role"), fmt::format("expected \"prologue\", \"attention\", \"backward\" or \"sla\", "
                                                      "found \"{}\"",
                                                      entry.role));
  entry.name = reader.string("name");
  entry.schedule = reader.string("schedule");
  entry.tunables = reader.string("tunables");
  entry.arch = reader.string("arch");
  entry.input = reader.string("input");
  if (entry.input != "f16" && entry.input != "bf16")
    reader.fail(reader.fieldPath("input"), fmt::format("expected \"f16\" or \"bf16\", found \"{}\"", entry.input));
  entry.entry_point = reader.name("entry_point");
  entry.source_sha256 = reader.hex("source_sha256", 64);
  // Each file's name is the one emit derives from this entry: a name from another entry, or of another file, is
  // refused here rather than loaded for this entry's key or deleted by the next emit.
  auto derived = [&](std::string_view field, const std::string &expected) {
    std::string listed = reader.fileName(field);
    if (listed != expected)
      reader.fail(reader.fieldPath(field), fmt::format("expected \"{}\" (from this entry's entry_point, source_sha256 "
                                                       "and arch), found \"{}\"",
                                                       expected, listed));
    return listed;
  };
  entry.source_file = derived("source", aotSourceFileName(entry.entry_point, entry.source_sha256));
  if (reader.optional("ptx"))
    entry.ptx_file = derived("ptx", aotImageFileName(entry.entry_point, entry.source_sha256, entry.arch, "ptx"));
  if (reader.optional("cubin")) {
    entry.cubin_file = derived("cubin", aotImageFileName(entry.entry_point, entry.source_sha256, entry.arch, "cubin"));
    entry.cubin_sha256 = reader.hex("cubin_sha256", 64);
  } else if (reader.optional("cubin_sha256")) {
    reader.fail(reader.fieldPath("cubin_sha256"), "given without a cubin");
  }

  ObjectReader launch(reader.typed("launch", JsonValue::Kind::object, "an object"), reader.fieldPath("launch"), origin);
  const JsonValue::Array &block = launch.typed("block", JsonValue::Kind::array, "an array").asArray();
  if (block.size() != 3)
    launch.fail(launch.fieldPath("block"), fmt::format("expected 3 dimensions, found {}", block.size()));
  for (size_t axis = 0; axis < 3; ++axis)
    entry.block[axis] = launch.integerOf(block[axis], fmt::format("{}[{}]", launch.fieldPath("block"), axis), 1);
  // CUDA's limits: at most 1024 threads per block (and so per axis), at most 227 KiB of shared memory per block.
  if (int64_t(entry.block[0]) * entry.block[1] * entry.block[2] > 1024)
    launch.fail(launch.fieldPath("block"), fmt::format("{} x {} x {} threads: a block has at most 1024", entry.block[0],
                                                       entry.block[1], entry.block[2]));
  entry.grid_rule = launch.string("grid");
  entry.dynamic_shared_bytes = launch.integer("dynamic_shared_bytes", 0);
  if (entry.dynamic_shared_bytes > 227 * 1024)
    launch.fail(launch.fieldPath("dynamic_shared_bytes"),
                fmt::format("expected at most 232448 (227 KiB), found {}", entry.dynamic_shared_bytes));
  launch.rejectUnknownFields();

  if (const JsonValue *resources = reader.optional("resources"))
    entry.resources = readResources(*resources, reader.fieldPath("resources"), origin);
  reader.rejectUnknownFields();

  // The descriptive fields must tell the same story as the key they describe.
  auto agree = [&](std::string_view field, const std::string &listed, const std::string &in_key) {
    if (listed != in_key)
      reader.fail(reader.fieldPath(field), fmt::format("\"{}\" does not match the key text's \"{}\"", listed, in_key));
  };
  agree("schedule", entry.schedule, key->schedule);
  agree("tunables", entry.tunables, key->tunables);
  agree("arch", entry.arch, key->arch);
  agree("head_dim", std::to_string(entry.head_dim), std::to_string(key->head_dim));
  agree("causal", entry.causal ? "true" : "false", key->causal ? "true" : "false");
  if (!key->extra.starts_with(entry.entry_point + ";"))
    reader.fail(reader.fieldPath("entry_point"),
                fmt::format("\"{}\" does not match the key text's extra \"{}\"", entry.entry_point, key->extra));
  return entry;
}

AotSkippedVariant readSkipped(const JsonValue &value, const std::string &path, std::string_view origin) {
  ObjectReader reader(value, path, origin);
  AotSkippedVariant skipped;
  skipped.preset = reader.string("preset");
  skipped.head_dim = reader.integer("head_dim", 1);
  skipped.causal = reader.boolean("causal");
  skipped.packed = reader.optionalBoolean("packed");
  skipped.input = reader.string("input");
  skipped.arch = reader.string("arch");
  skipped.reason = reader.string("reason");
  reader.rejectUnknownFields();
  return skipped;
}

} // namespace

std::string aotSourceFileName(std::string_view entry_point, std::string_view source_sha256) {
  return fmt::format("{}-{}.cu", entry_point, source_sha256.substr(0, 12));
}

std::string aotImageFileName(std::string_view entry_point, std::string_view source_sha256, std::string_view arch,
                             std::string_view extension) {
  return fmt::format("{}-{}.{}.{}", entry_point, source_sha256.substr(0, 12), arch, extension);
}

const AotKernelEntry *AotManifest::find(std::string_view key_digest) const {
  auto found = std::find_if(kernels.begin(), kernels.end(),
                            [&](const AotKernelEntry &entry) { return entry.key_digest == key_digest; });
  return found == kernels.end() ? nullptr : &*found;
}

AotManifest parseAotManifest(std::string_view text, std::string_view origin) {
  JsonValue root;
  try {
    root = parseJson(text);
  } catch (const JsonError &error) {
    throw AotManifestError(fmt::format("{}: not valid JSON: {}", origin, error.what()));
  }
  ObjectReader reader(root, "", origin);
  AotManifest manifest;
  // The schema name and version first: a file of another kind or version gets that message, not a field's.
  std::string schema = reader.string("schema");
  if (schema != kAotManifestSchema)
    reader.fail("schema", fmt::format("expected \"{}\", found \"{}\"", kAotManifestSchema, schema));
  manifest.schema_version = reader.integer("schema_version", 1);
  if (manifest.schema_version != kAotManifestSchemaVersion)
    reader.fail("schema_version", fmt::format("version {} is not supported (this sagegen reads version {})",
                                              manifest.schema_version, kAotManifestSchemaVersion));
  manifest.key_format_version = reader.integer("key_format_version", 1);
  if (manifest.key_format_version != kKernelKeyFormatVersion)
    reader.fail("key_format_version", fmt::format("version {} is not supported (this sagegen's keys are version {})",
                                                  manifest.key_format_version, kKernelKeyFormatVersion));
  manifest.sagegen_version = reader.string("sagegen_version");
  manifest.nvrtc_version = reader.string("nvrtc_version");

  const JsonValue::Array &kernels = reader.typed("kernels", JsonValue::Kind::array, "an array").asArray();
  std::set<std::string, std::less<>> digests;
  for (size_t index = 0; index < kernels.size(); ++index) {
    std::string path = fmt::format("kernels[{}]", index);
    AotKernelEntry entry = readKernel(kernels[index], path, origin);
    if (!digests.insert(entry.key_digest).second)
      reader.fail(path + ".key_digest", "listed twice");
    manifest.kernels.push_back(std::move(entry));
  }
  const JsonValue::Array &skipped = reader.typed("skipped", JsonValue::Kind::array, "an array").asArray();
  for (size_t index = 0; index < skipped.size(); ++index)
    manifest.skipped.push_back(readSkipped(skipped[index], fmt::format("skipped[{}]", index), origin));
  reader.rejectUnknownFields();
  return manifest;
}

AotManifest loadAotManifest(const std::filesystem::path &directory) {
  const std::filesystem::path path = directory / kAotManifestFileName;
  cache_files::ReadResult file = cache_files::readWholeFile(path);
  if (file.outcome == cache_files::ReadOutcome::missing)
    throw AotManifestError(fmt::format("{}: cannot open the manifest: no such file", path.string()));
  if (file.outcome == cache_files::ReadOutcome::failed)
    throw AotManifestError(fmt::format("cannot read the manifest: {}", file.error));
  return parseAotManifest(std::string(file.bytes.begin(), file.bytes.end()), path.string());
}

JsonValue aotManifestJson(const AotManifest &manifest) {
  JsonValue root = JsonValue::object();
  root.set("schema", kAotManifestSchema);
  root.set("schema_version", manifest.schema_version);
  root.set("key_format_version", manifest.key_format_version);
  root.set("sagegen_version", manifest.sagegen_version);
  root.set("nvrtc_version", manifest.nvrtc_version);
  JsonValue kernels = JsonValue::array();
  for (const AotKernelEntry &entry : manifest.kernels) {
    JsonValue kernel(JsonValue::Object{{"key_digest", entry.key_digest},
                                       {"key_text", entry.key_text},
                                       {"variant", entry.variant},
                                       {"preset", entry.preset},
                                       {"head_dim", entry.head_dim},
                                       {"causal", entry.causal},
                                       {"lse", entry.lse},
                                       {"role", entry.role},
                                       {"name", entry.name},
                                       {"schedule", entry.schedule},
                                       {"tunables", entry.tunables},
                                       {"arch", entry.arch},
                                       {"input", entry.input},
                                       {"entry_point", entry.entry_point},
                                       {"source", entry.source_file},
                                       {"source_sha256", entry.source_sha256}});
    if (entry.packed) // written only when true: manifests without packed kernels are unchanged
      kernel.set("packed", true);
    if (!entry.ptx_file.empty())
      kernel.set("ptx", entry.ptx_file);
    if (!entry.cubin_file.empty()) {
      kernel.set("cubin", entry.cubin_file);
      kernel.set("cubin_sha256", entry.cubin_sha256);
    }
    JsonValue launch = JsonValue::object();
    launch.set("block", JsonValue(JsonValue::Array{entry.block[0], entry.block[1], entry.block[2]}));
    launch.set("grid", entry.grid_rule);
    launch.set("dynamic_shared_bytes", entry.dynamic_shared_bytes);
    kernel.set("launch", std::move(launch));
    if (entry.resources) {
      JsonValue resources(JsonValue::Object{{"registers", entry.resources->registers},
                                            {"spill_store_bytes", entry.resources->spill_store_bytes},
                                            {"spill_load_bytes", entry.resources->spill_load_bytes},
                                            {"static_shared_bytes", entry.resources->static_shared_bytes},
                                            {"stack_frame_bytes", entry.resources->stack_frame_bytes}});
      kernel.set("resources", std::move(resources));
    }
    kernels.push(std::move(kernel));
  }
  root.set("kernels", std::move(kernels));
  JsonValue skipped = JsonValue::array();
  for (const AotSkippedVariant &entry : manifest.skipped) {
    JsonValue item(JsonValue::Object{{"preset", entry.preset},
                                     {"head_dim", entry.head_dim},
                                     {"causal", entry.causal},
                                     {"input", entry.input},
                                     {"arch", entry.arch},
                                     {"reason", entry.reason}});
    if (entry.packed)
      item.set("packed", true);
    skipped.push(std::move(item));
  }
  root.set("skipped", std::move(skipped));
  return root;
}

std::string writeAotManifest(const AotManifest &manifest) { return writeJson(aotManifestJson(manifest), 2) + "\n"; }

} // namespace sage::runtime
