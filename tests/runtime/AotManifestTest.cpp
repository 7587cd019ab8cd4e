// The AOT manifest: the committed generated/manifest.json loads and agrees with its files; the writer round-trips;
// malformed manifests are rejected with a message naming the field.
#include "sage/runtime/AotManifest.h"
#include "sage/runtime/Json.h"

#include "sage/runtime/KernelKey.h"
#include "sage/runtime/Sha256.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <set>
#include <sstream>
#include <string>

using namespace sage::runtime;
namespace fs = std::filesystem;

namespace {

std::string readText(const fs::path &path) {
  std::ifstream file(path, std::ios::binary);
  REQUIRE_MESSAGE(file, "cannot open " << path.string());
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

AotKernelEntry sampleEntry(const std::string &arch) {
  KernelKey key;
  key.ir_hash = "07bb42a868a8546a";
  key.schedule = "sm80.mma_sync";
  key.tunables = "block_q=128,block_kv=64,warps=8,stages=3";
  key.head_dim = 128;
  key.dtypes = "qkv=f16,o=f16";
  key.layout = "strided";
  key.arch = arch;
  key.compiler_version = "13.0";
  key.sagegen_version = sagegenVersion();
  key.extra = "sage_attention_x;source-sha256=" + sha256Hex(std::string_view("source"));
  AotKernelEntry entry;
  entry.key_text = key.text();
  entry.key_digest = key.digest();
  entry.variant = entry.preset = "sage-b";
  entry.head_dim = 128;
  entry.role = "attention";
  entry.name = "attention";
  entry.schedule = key.schedule;
  entry.tunables = key.tunables;
  entry.arch = arch;
  entry.input = "f16";
  entry.entry_point = "sage_attention_x";
  entry.source_sha256 = sha256Hex(std::string_view("source"));
  entry.source_file = "sage_attention_x-" + entry.source_sha256.substr(0, 12) + ".cu";
  entry.block = {256, 1, 1};
  entry.grid_rule = "(ceil(tokens_q / 128), heads_q, batch)";
  entry.dynamic_shared_bytes = 65536;
  entry.resources = AotKernelResources{128, 0, 0, 0, 0};
  return entry;
}

AotManifest sampleManifest() {
  AotManifest manifest;
  manifest.key_format_version = kKernelKeyFormatVersion;
  manifest.sagegen_version = sagegenVersion();
  manifest.nvrtc_version = "13.0";
  manifest.kernels.push_back(sampleEntry("sm_80"));
  AotKernelEntry with_cubin = sampleEntry("sm_90a");
  const std::string stem = "sage_attention_x-" + with_cubin.source_sha256.substr(0, 12);
  with_cubin.cubin_file = stem + ".sm_90a.cubin";
  with_cubin.cubin_sha256 = sha256Hex(std::string_view("cubin"));
  with_cubin.ptx_file = stem + ".sm_90a.ptx";
  manifest.kernels.push_back(with_cubin);
  manifest.skipped.push_back({"sage2-fp8", 64, false, "f16", "sm_80", "no schedule supports it"});
  return manifest;
}

// The error parseAotManifest gives for the sample manifest after `edit`.
std::string errorAfter(const std::function<void(JsonValue &)> &edit) {
  JsonValue root = aotManifestJson(sampleManifest());
  edit(root);
  try {
    parseAotManifest(writeJson(root), "test.json");
  } catch (const AotManifestError &error) {
    return error.what();
  }
  return "accepted";
}

JsonValue &firstKernel(JsonValue &root) { return root.find("kernels")->asArray()[0]; }

void removeField(JsonValue &object, std::string_view name) {
  auto &members = object.asObject();
  std::erase_if(members, [&](const JsonValue::Member &member) { return member.first == name; });
}

} // namespace

TEST_CASE("the committed generated/ manifest loads, and every entry's source file is there with its SHA-256") {
  const fs::path directory = SAGEGEN_GENERATED_DIR;
  AotManifest manifest = loadAotManifest(directory);
  CHECK(manifest.schema_version == kAotManifestSchemaVersion);
  REQUIRE(!manifest.kernels.empty());
  std::set<std::string> presets, archs, roles, inputs;
  for (const AotKernelEntry &entry : manifest.kernels) {
    CAPTURE(entry.source_file);
    CHECK(sha256Hex(readText(directory / entry.source_file)) == entry.source_sha256);
    CHECK(parseKernelKeyText(entry.key_text)->extra.ends_with(entry.source_sha256));
    CHECK(entry.resources.has_value()); // committed manifests record ptxas's numbers
    CHECK(entry.cubin_file.empty());    // and no cubins
    presets.insert(entry.preset);
    archs.insert(entry.arch);
    roles.insert(entry.role);
    inputs.insert(entry.input);
  }
  CHECK(presets == std::set<std::string>{"sage-t", "sage-b", "sage-vt", "sage-vb", "sage2-fp8", "exact"});
  CHECK(archs == std::set<std::string>{"sm_80", "sm_89", "sm_90a"});
  CHECK(roles == std::set<std::string>{"prologue", "attention"});
  CHECK(inputs == std::set<std::string>{"f16", "bf16"});
  // What cannot be generated is recorded with the reason: FP8 P.V needs sm_89 (2 head dims x 2 masks x 2 inputs).
  size_t fp8_on_sm80 = 0;
  for (const AotSkippedVariant &skipped : manifest.skipped) {
    CAPTURE(skipped.reason);
    CHECK(!skipped.reason.empty());
    fp8_on_sm80 += skipped.preset == "sage2-fp8" && skipped.arch == "sm_80";
  }
  CHECK(fp8_on_sm80 == 8);
  CHECK(manifest.skipped.size() == fp8_on_sm80);
  // Every file in the directory is either listed or documentation: nothing stale is committed.
  std::set<std::string> listed{"manifest.json", "README.md"};
  for (const AotKernelEntry &entry : manifest.kernels)
    listed.insert(entry.source_file);
  for (const auto &item : fs::directory_iterator(directory))
    CHECK_MESSAGE(listed.contains(item.path().filename().string()), item.path().string() << " is not listed");
}

TEST_CASE("a written manifest reads back equal, and writing is deterministic") {
  AotManifest manifest = sampleManifest();
  std::string text = writeAotManifest(manifest);
  CHECK(text.ends_with("}\n"));
  AotManifest read = parseAotManifest(text);
  CHECK(read == manifest);
  CHECK(writeAotManifest(read) == text);
  REQUIRE(read.find(manifest.kernels[1].key_digest) != nullptr);
  CHECK(read.find(manifest.kernels[1].key_digest)->cubin_file == manifest.kernels[1].cubin_file);
  CHECK(read.find(std::string(64, '0')) == nullptr);
}

TEST_CASE("malformed manifests are rejected with the field's path and the problem") {
  CHECK(errorAfter([](JsonValue &) {}) == "accepted");
  CHECK(errorAfter([](JsonValue &root) { root = JsonValue::array(); }) ==
        "test.json: top level: expected an object, found an array");
  CHECK(errorAfter([](JsonValue &root) { root.set("schema", "something-else"); }) ==
        "test.json: schema: expected \"sagegen-aot-manifest\", found \"something-else\"");
  CHECK(errorAfter([](JsonValue &root) { root.set("schema_version", 2); }) ==
        "test.json: schema_version: version 2 is not supported (this sagegen reads version 1)");
  CHECK(errorAfter([](JsonValue &root) { root.set("schema_version", "1"); }) ==
        "test.json: schema_version: expected an integer, found a string");
  CHECK(errorAfter([](JsonValue &root) { root.set("key_format_version", 7); }).find("key_format_version: version 7") !=
        std::string::npos);
  CHECK(errorAfter([](JsonValue &root) { removeField(root, "nvrtc_version"); }) ==
        "test.json: nvrtc_version: required field is missing");
  CHECK(errorAfter([](JsonValue &root) { root.set("kernels", JsonValue::object()); }) ==
        "test.json: kernels: expected an array, found an object");
  CHECK(errorAfter([](JsonValue &root) { root.set("extra", 1); }) ==
        "test.json: extra: unknown field (not in manifest schema version 1)");

  CHECK(errorAfter([](JsonValue &root) { removeField(firstKernel(root), "entry_point"); }) ==
        "test.json: kernels[0].entry_point: required field is missing");
  CHECK(errorAfter([](JsonValue &root) { firstKernel(root).set("head_dim", 64.5); }) ==
        "test.json: kernels[0].head_dim: expected an integer >= 16, found 64.5");
  CHECK(errorAfter([](JsonValue &root) { firstKernel(root).set("head_dim", 100); }) ==
        "test.json: kernels[0].head_dim: expected a multiple of 16 in [16, 256], found 100");
  CHECK(errorAfter([](JsonValue &root) { firstKernel(root).set("preset", "sage b\"; rm"); }) ==
        "test.json: kernels[0].preset: expected a name of at most 128 of [A-Za-z0-9_.-], found \"sage b\"; rm\"");
  CHECK(errorAfter([](JsonValue &root) { firstKernel(root).set("causal", "no"); }) ==
        "test.json: kernels[0].causal: expected a boolean, found a string");
  CHECK(errorAfter([](JsonValue &root) { firstKernel(root).set("key_digest", std::string(64, 'a')); }) ==
        "test.json: kernels[0].key_digest: is not the SHA-256 of key_text");
  CHECK(errorAfter([](JsonValue &root) { firstKernel(root).set("key_digest", "ABC"); }) ==
        "test.json: kernels[0].key_digest: expected 64 lower-case hex digits, found \"ABC\"");
  CHECK(errorAfter([](JsonValue &root) {
          JsonValue &kernel = firstKernel(root);
          kernel.set("key_text", "not a key");
          kernel.set("key_digest", sha256Hex(std::string_view("not a key")));
        }) == "test.json: kernels[0].key_text: not a kernel key text of key format version 1");
  CHECK(errorAfter([](JsonValue &root) { firstKernel(root).set("source", "../../etc/passwd"); }) ==
        "test.json: kernels[0].source: expected a file name inside the manifest's directory, found "
        "\"../../etc/passwd\"");
  CHECK(
      errorAfter([](JsonValue &root) { firstKernel(root).set("role", "epilogue"); }) ==
      "test.json: kernels[0].role: expected \"prologue\", \"attention\", \"backward\" or \"sla\", found \"epilogue\"");
  CHECK(errorAfter([](JsonValue &root) { firstKernel(root).set("arch", "sm_89"); }) ==
        "test.json: kernels[0].arch: \"sm_89\" does not match the key text's \"sm_80\"");
  CHECK(errorAfter([](JsonValue &root) { firstKernel(root).set("cubin_sha256", std::string(64, '0')); }) ==
        "test.json: kernels[0].cubin_sha256: given without a cubin");
  CHECK(errorAfter([](JsonValue &root) { removeField(root.find("kernels")->asArray()[1], "cubin_sha256"); }) ==
        "test.json: kernels[1].cubin_sha256: required field is missing");
  CHECK(errorAfter([](JsonValue &root) {
          firstKernel(root).find("launch")->set("block", JsonValue(JsonValue::Array{256, -1, 1}));
        }) == "test.json: kernels[0].launch.block[1]: expected an integer >= 1, found -1");
  CHECK(errorAfter([](JsonValue &root) {
          firstKernel(root).find("launch")->set("block", JsonValue(JsonValue::Array{256, 1}));
        }) == "test.json: kernels[0].launch.block: expected 3 dimensions, found 2");
  CHECK(errorAfter([](JsonValue &root) {
          firstKernel(root).find("launch")->set("block", JsonValue(JsonValue::Array{1024, 1024, 1024}));
        }) == "test.json: kernels[0].launch.block: 1024 x 1024 x 1024 threads: a block has at most 1024");
  CHECK(errorAfter([](JsonValue &root) { firstKernel(root).find("launch")->set("dynamic_shared_bytes", 1 << 20); }) ==
        "test.json: kernels[0].launch.dynamic_shared_bytes: expected at most 232448 (227 KiB), found 1048576");
  CHECK(errorAfter([](JsonValue &root) { firstKernel(root).find("resources")->set("registers", "many"); }) ==
        "test.json: kernels[0].resources.registers: expected an integer, found a string");
  CHECK(errorAfter([](JsonValue &root) { firstKernel(root).set("colour", "blue"); }) ==
        "test.json: kernels[0].colour: unknown field (not in manifest schema version 1)");
  CHECK(errorAfter([](JsonValue &root) {
          JsonValue::Array &kernels = root.find("kernels")->asArray();
          kernels.push_back(kernels[0]);
        }) == "test.json: kernels[2].key_digest: listed twice");
  CHECK(errorAfter([](JsonValue &root) { removeField(root.find("skipped")->asArray()[0], "reason"); }) ==
        "test.json: skipped[0].reason: required field is missing");
}

TEST_CASE("a packed kernel's flag round-trips; written only when true, and read as false when left out (issue 28)") {
  AotManifest manifest = sampleManifest();
  const std::string dense_text = writeAotManifest(manifest);
  CHECK(dense_text.find("\"packed\"") == std::string::npos); // manifests without packed kernels are unchanged
  manifest.kernels[1].packed = true;
  manifest.skipped.push_back({"sla-f16", 64, false, "f16", "sm_90a", "packed_sequences: SLA is not built", true});
  const std::string text = writeAotManifest(manifest);
  const AotManifest read = parseAotManifest(text);
  CHECK(read == manifest);
  CHECK_FALSE(read.kernels[0].packed);
  CHECK(read.kernels[1].packed);
  CHECK(read.skipped[1].packed);
  CHECK(writeAotManifest(read) == text);
  CHECK(errorAfter([](JsonValue &root) { firstKernel(root).set("packed", false); }) == "accepted");
  CHECK(errorAfter([](JsonValue &root) { firstKernel(root).set("packed", "yes"); }) ==
        "test.json: kernels[0].packed: expected a boolean, found a string");
  CHECK(errorAfter([](JsonValue &root) { root.find("skipped")->asArray()[0].set("packed", 1); }) ==
        "test.json: skipped[0].packed: expected a boolean, found a number");
}

TEST_CASE("file names must be the ones emit derives from the entry: swapped cubin/hash pairs are refused (issue 26)") {
  AotManifest manifest = sampleManifest();
  AotKernelEntry other = sampleEntry("sm_89");
  const std::string stem = "sage_attention_x-" + other.source_sha256.substr(0, 12);
  other.cubin_file = stem + ".sm_89.cubin";
  other.cubin_sha256 = sha256Hex(std::string_view("another cubin"));
  manifest.kernels.push_back(other);
  CHECK(parseAotManifest(writeAotManifest(manifest), "test.json") == manifest);

  // The sm_90a entry lists the sm_89 cubin and its hash, and the other way round: each pair is consistent, but each
  // entry would load the other's cubin for its key.
  std::swap(manifest.kernels[1].cubin_file, manifest.kernels[2].cubin_file);
  std::swap(manifest.kernels[1].cubin_sha256, manifest.kernels[2].cubin_sha256);
  CHECK_THROWS_WITH_AS(parseAotManifest(writeAotManifest(manifest), "test.json"),
                       ("test.json: kernels[1].cubin: expected \"" + stem +
                        ".sm_90a.cubin\" (from this entry's entry_point, source_sha256 and arch), found \"" + stem +
                        ".sm_89.cubin\"")
                           .c_str(),
                       AotManifestError);

  // A file emit did not name: a plain name in the directory, but not this kernel's.
  CHECK(errorAfter([](JsonValue &root) {
          firstKernel(root).set("source", "notes.txt");
        }).starts_with("test.json: kernels[0].source: expected \"sage_attention_x-"));
  CHECK(errorAfter([](JsonValue &root) {
          root.find("kernels")->asArray()[1].set("ptx", "sage_attention_x-000000000000.sm_90a.ptx");
        }).starts_with("test.json: kernels[1].ptx: expected"));
  CHECK(errorAfter([](JsonValue &root) {
          firstKernel(root).set("entry_point", "../x");
        }).starts_with("test.json: kernels[0].entry_point: expected a name"));
}

TEST_CASE("text that is not JSON, and a missing manifest, are errors that say so") {
  CHECK_THROWS_WITH_AS(parseAotManifest("{\"schema\": ", "broken.json"),
                       doctest::Contains("broken.json: not valid JSON: line 1"), AotManifestError);
  CHECK_THROWS_WITH_AS(loadAotManifest("/nonexistent-sagegen-dir"),
                       doctest::Contains("/nonexistent-sagegen-dir/manifest.json: cannot open the manifest"),
                       AotManifestError);
}

TEST_CASE("the committed generated/manifest.json reads and writes back byte for byte") {
  std::ifstream file(std::string(SAGEGEN_GENERATED_DIR) + "/manifest.json", std::ios::binary);
  REQUIRE(file);
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  CHECK(writeJson(parseJson(text), 2) + "\n" == text);
}
