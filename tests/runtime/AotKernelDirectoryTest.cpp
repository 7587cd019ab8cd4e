// AOT kernel lookup without a GPU: find() returns a directory's cubin only for the exact key and an intact CUDA
// image; otherwise it declines with the reason (and warns when something is wrong rather than merely absent).
#include "sage/runtime/AotKernelDirectory.h"
#include "../support/TemporaryDirectory.h"

#include "sage/runtime/NvrtcCompiler.h"
#include "sage/runtime/Sha256.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

using namespace sage::runtime;
namespace fs = std::filesystem;

namespace {

// This program's scratch directories.
struct TemporaryDirectory : sage::test::TemporaryDirectory {
  TemporaryDirectory() : sage::test::TemporaryDirectory("sagegen-aot-test") {}
};

void writeBytes(const fs::path &path, std::string_view bytes) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(file.good());
}

const std::string kSource = "extern \"C\" __global__ void aot_probe(int *out) { out[threadIdx.x] = 7; }\n";

KernelKey probeKey(const std::string &compiler_version = nvrtcVersion()) {
  KernelKey key;
  key.ir_hash = "0123456789abcdef";
  key.schedule = "sm80.mma_sync";
  key.tunables = "block_q=128,block_kv=64,warps=4,stages=3";
  key.head_dim = 64;
  key.dtypes = "qkv=f16,o=f16";
  key.layout = "strided";
  key.arch = "sm_80";
  key.compiler_version = compiler_version;
  key.sagegen_version = sagegenVersion();
  key.extra = "aot_probe;source-sha256=" + sha256Hex(kSource);
  return key;
}

// A real cubin of a tiny kernel, compiled once.
const ByteBuffer &probeCubin() {
  static const ByteBuffer cubin = [] {
    CompileRequest request;
    request.key = "aot_probe";
    request.source = kSource;
    request.options.arch = "sm_80";
    return NvrtcCompiler().compileCubin(request).image;
  }();
  return cubin;
}

std::string_view textOf(const ByteBuffer &bytes) {
  return {reinterpret_cast<const char *>(bytes.data()), bytes.size()};
}

AotKernelEntry entryFor(const KernelKey &key, bool with_cubin) {
  AotKernelEntry entry;
  entry.key_text = key.text();
  entry.key_digest = key.digest();
  entry.variant = entry.preset = "probe";
  entry.head_dim = key.head_dim;
  entry.role = "attention";
  entry.name = "probe";
  entry.schedule = key.schedule;
  entry.tunables = key.tunables;
  entry.arch = key.arch;
  entry.input = "f16";
  entry.entry_point = "aot_probe";
  entry.source_sha256 = sha256Hex(kSource);
  entry.source_file = aotSourceFileName(entry.entry_point, entry.source_sha256);
  entry.grid_rule = "(1, 1, 1)";
  if (with_cubin) {
    entry.cubin_file = aotImageFileName(entry.entry_point, entry.source_sha256, entry.arch, "cubin");
    entry.cubin_sha256 = sha256Hex(probeCubin());
  }
  return entry;
}

// A directory with a manifest listing `entries` and the probe's files.
void writeDirectory(const fs::path &directory, const std::vector<AotKernelEntry> &entries) {
  AotManifest manifest;
  manifest.key_format_version = kKernelKeyFormatVersion;
  manifest.sagegen_version = sagegenVersion();
  manifest.nvrtc_version = nvrtcVersion();
  manifest.kernels = entries;
  writeBytes(directory / "manifest.json", writeAotManifest(manifest));
  writeBytes(directory / aotSourceFileName("aot_probe", sha256Hex(kSource)), kSource);
  writeBytes(directory / aotImageFileName("aot_probe", sha256Hex(kSource), "sm_80", "cubin"), textOf(probeCubin()));
}

struct Lookup {
  AotLookup result;
  std::vector<std::string> warnings;
};

Lookup lookUp(const fs::path &directory, const KernelKey &key, std::optional<bool> packed = std::nullopt) {
  Lookup lookup;
  AotKernelDirectory aot(directory, [&](const std::string &warning) { lookup.warnings.push_back(warning); });
  lookup.result = aot.find(key, packed);
  return lookup;
}

} // namespace

TEST_CASE("a listed kernel with an intact cubin is found, with the cubin's bytes") {
  TemporaryDirectory directory;
  writeDirectory(directory.path, {entryFor(probeKey(), true)});
  Lookup lookup = lookUp(directory.path, probeKey());
  CHECK(lookup.result.outcome == AotLookupOutcome::found);
  CHECK(lookup.result.image == probeCubin());
  CHECK(lookup.warnings.empty());
}

TEST_CASE("keys that differ in any field, e.g. the NVRTC version, are not listed: no warning, JIT instead") {
  TemporaryDirectory directory;
  writeDirectory(directory.path, {entryFor(probeKey("12.4"), true)});
  Lookup lookup = lookUp(directory.path, probeKey());
  CHECK(lookup.result.outcome == AotLookupOutcome::not_listed);
  CHECK(lookup.result.image.empty());
  CHECK(lookup.result.reason.find("no kernel with key digest " + probeKey().digest().substr(0, 16)) !=
        std::string::npos);
  CHECK(lookup.warnings.empty());
  KernelKey causal = probeKey("12.4");
  causal.causal = true;
  CHECK(lookUp(directory.path, causal).result.outcome == AotLookupOutcome::not_listed);
}

TEST_CASE("a packed call is never served a dense kernel, nor a dense call a packed one (issue 28)") {
  TemporaryDirectory packed_directory, dense_directory;
  AotKernelEntry packed = entryFor(probeKey(), true);
  packed.packed = true;
  writeDirectory(packed_directory.path, {packed});
  writeDirectory(dense_directory.path, {entryFor(probeKey(), true)});
  CHECK(lookUp(packed_directory.path, probeKey(), true).result.outcome == AotLookupOutcome::found);
  CHECK(lookUp(dense_directory.path, probeKey(), false).result.outcome == AotLookupOutcome::found);
  CHECK(lookUp(dense_directory.path, probeKey()).result.outcome == AotLookupOutcome::found); // kind not said
  for (const auto &[directory, asked] : {std::pair{&packed_directory, false}, std::pair{&dense_directory, true}}) {
    Lookup lookup = lookUp(directory->path, probeKey(), asked);
    CHECK(lookup.result.outcome == AotLookupOutcome::rejected);
    CHECK(lookup.result.image.empty());
    CHECK(lookup.result.reason.find(asked ? "lists a dense kernel, the call needs a packed (variable-length) one"
                                          : "lists a packed (variable-length) kernel, the call needs a dense one") !=
          std::string::npos);
    REQUIRE(lookup.warnings.size() == 1);
    CHECK(lookup.warnings[0].find("compiling it at run time instead") != std::string::npos);
  }
}

TEST_CASE("a kernel emitted as source only is declined without a warning") {
  TemporaryDirectory directory;
  writeDirectory(directory.path, {entryFor(probeKey(), false)});
  Lookup lookup = lookUp(directory.path, probeKey());
  CHECK(lookup.result.outcome == AotLookupOutcome::no_cubin);
  CHECK(lookup.result.reason.find("emitted without a cubin") != std::string::npos);
  CHECK(lookup.warnings.empty());
}

TEST_CASE("a damaged, missing or foreign cubin is rejected with a warning, never handed out") {
  TemporaryDirectory directory;
  writeDirectory(directory.path, {entryFor(probeKey(), true)});
  const fs::path cubin = directory.path / aotImageFileName("aot_probe", sha256Hex(kSource), "sm_80", "cubin");

  SUBCASE("one flipped byte") {
    std::string bytes(textOf(probeCubin()));
    bytes[bytes.size() / 2] ^= 0x40;
    writeBytes(cubin, bytes);
    Lookup lookup = lookUp(directory.path, probeKey());
    CHECK(lookup.result.outcome == AotLookupOutcome::rejected);
    CHECK(lookup.result.image.empty());
    CHECK(lookup.result.reason.find("is damaged (its SHA-256 differs from the manifest's)") != std::string::npos);
    REQUIRE(lookup.warnings.size() == 1);
    CHECK(lookup.warnings[0].find("compiling it at run time instead") != std::string::npos);
  }
  SUBCASE("truncated") {
    writeBytes(cubin, textOf(probeCubin()).substr(0, 100));
    CHECK(lookUp(directory.path, probeKey()).result.outcome == AotLookupOutcome::rejected);
  }
  SUBCASE("missing") {
    fs::remove(cubin);
    Lookup lookup = lookUp(directory.path, probeKey());
    CHECK(lookup.result.outcome == AotLookupOutcome::rejected);
    CHECK(lookup.result.reason.find("is missing") != std::string::npos);
    CHECK(lookup.warnings.size() == 1);
  }
  SUBCASE("not a CUDA image, even with a matching checksum") {
    const std::string ptx = ".version 8.0\n.target sm_80\n";
    AotKernelEntry entry = entryFor(probeKey(), true);
    entry.cubin_sha256 = sha256Hex(ptx);
    writeDirectory(directory.path, {entry});
    writeBytes(cubin, ptx);
    Lookup lookup = lookUp(directory.path, probeKey());
    CHECK(lookup.result.outcome == AotLookupOutcome::rejected);
    CHECK(lookup.result.reason.find("not an ELF image") != std::string::npos);
  }
}

TEST_CASE("a missing or malformed manifest is one warning, and every lookup declines") {
  TemporaryDirectory directory;
  std::vector<std::string> warnings;
  {
    AotKernelDirectory aot(directory.path, [&](const std::string &warning) { warnings.push_back(warning); });
    CHECK(!aot.manifest());
    CHECK(aot.find(probeKey()).outcome == AotLookupOutcome::no_manifest);
    CHECK(aot.find(probeKey()).reason.find("cannot open the manifest") != std::string::npos);
  }
  CHECK(warnings.size() == 1);
  writeBytes(directory.path / "manifest.json", "{\"schema\": \"sagegen-aot-manifest\", \"schema_version\": 9}");
  Lookup lookup = lookUp(directory.path, probeKey());
  CHECK(lookup.result.outcome == AotLookupOutcome::no_manifest);
  CHECK(lookup.result.reason.find("schema_version: version 9 is not supported") != std::string::npos);
  CHECK(lookup.warnings.size() == 1);
}

TEST_CASE("cudaElfProblem accepts a cubin and names what is wrong with other images") {
  CHECK(!cudaElfProblem(probeCubin()));
  ByteBuffer other = probeCubin();
  other[18] = 62; // EM_X86_64
  other[19] = 0;
  CHECK(cudaElfProblem(other) == "an ELF image for machine 62, not CUDA (190)");
  CHECK(cudaElfProblem(bytesOf("short")) == "not an ELF image");
}

TEST_CASE("the default directory is $SAGEGEN_AOT_DIR") {
  ::setenv("SAGEGEN_AOT_DIR", "/opt/kernels", 1);
  CHECK(AotKernelDirectory::defaultDirectory() == "/opt/kernels");
  ::unsetenv("SAGEGEN_AOT_DIR");
  CHECK(AotKernelDirectory::defaultDirectory().empty());
}
