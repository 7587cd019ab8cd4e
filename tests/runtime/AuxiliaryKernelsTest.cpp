// The SageBwd backward and SLA modules in the kernel cache and AOT directories: their keys (what changes the kernel
// changes the key, the same request gives the same key), a cache round trip and an AOT lookup with NVRTC (no GPU
// needed), and, on a GPU (tools/gpu-check --run), that a second runner of the same variant finds its module in
// memory, a fresh process-like cache finds it on disk, and an AOT directory comes first.
#include "sage/runtime/AuxiliaryKernels.h"

#include "sage/dsl/AttentionBackward.h"
#include "sage/dsl/Presets.h"
#include "sage/runtime/AotKernelDirectory.h"
#include "sage/runtime/AotManifest.h"
#include "sage/runtime/AttentionBackwardRunner.h"
#include "sage/runtime/AttentionKernelKeys.h"
#include "sage/runtime/DeviceArch.h"
#include "sage/runtime/KernelCache.h"
#include "sage/runtime/NvrtcCompiler.h"
#include "sage/runtime/Sha256.h"
#include "sage/runtime/SlaRunner.h"

#include "../support/SkipWithoutGpu.h"
#include "../support/TemporaryDirectory.h"

#include <doctest/doctest.h>

#include <fstream>
#include <set>
#include <stdexcept>
#include <string>

using namespace sage;
using namespace sage::runtime;
using schedules::GpuArch;
using schedules::InputType;

namespace {

ir::BackwardProgram backwardProgram(const std::string &preset, int head_dim, bool causal,
                                    InputType input = InputType::f16) {
  auto builder = dsl::backwardPreset(preset, head_dim, causal ? MaskKind::causal : MaskKind::none);
  REQUIRE(builder);
  builder->float_type(input == InputType::bf16 ? ElementType::bf16 : ElementType::f16);
  return builder->build();
}

BackwardKernelSet backwardKernels(const std::string &preset, int head_dim, bool causal, InputType input, GpuArch arch) {
  const ir::BackwardProgram program = backwardProgram(preset, head_dim, causal, input);
  return generateBackwardKernels(program.variant(), input, arch, program.fingerprint());
}

AttentionVariant slaVariant(const std::string &preset, int head_dim) {
  return dsl::preset(preset, head_dim)->build().variant();
}

void writeFile(const std::filesystem::path &path, std::string_view bytes) {
  std::ofstream file(path, std::ios::binary);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(file.good());
}

// An ahead-of-time directory as `sagegen emit` writes it, holding `module` compiled with NVRTC.
void writeAotDirectory(const std::filesystem::path &directory, const GeneratedKernel &module) {
  KernelCacheOptions memory_only;
  memory_only.memory_only = true;
  KernelCache cache(memory_only);
  const CacheResult compiled = cacheKernel(cache, module);
  const std::string_view cubin(reinterpret_cast<const char *>(compiled.image->data()), compiled.image->size());
  AotKernelEntry entry;
  entry.key_text = module.key.text();
  entry.key_digest = module.key.digest();
  entry.variant = entry.preset = "probe";
  entry.head_dim = module.key.head_dim;
  entry.causal = module.key.causal;
  entry.role = std::string(nameOf(module.role));
  entry.name = module.name;
  entry.schedule = module.key.schedule;
  entry.tunables = module.key.tunables;
  entry.arch = module.key.arch;
  entry.input = "f16";
  entry.entry_point = module.entry_point;
  entry.source_sha256 = sha256Hex(selfContainedSource(module));
  // The names emit derives from the entry: the manifest reader accepts no others.
  entry.source_file = aotSourceFileName(entry.entry_point, entry.source_sha256);
  entry.cubin_file = aotImageFileName(entry.entry_point, entry.source_sha256, entry.arch, "cubin");
  entry.cubin_sha256 = sha256Hex(cubin);
  entry.grid_rule = "per launch";
  AotManifest manifest;
  manifest.key_format_version = kKernelKeyFormatVersion;
  manifest.sagegen_version = sagegenVersion();
  manifest.nvrtc_version = nvrtcVersion();
  manifest.kernels.push_back(entry);
  writeFile(directory / std::string(kAotManifestFileName), writeAotManifest(manifest));
  writeFile(directory / entry.source_file, selfContainedSource(module));
  writeFile(directory / entry.cubin_file, cubin);
}

} // namespace

TEST_CASE("the backward module's key: what the module depends on, and the same request gives the same key") {
  const ir::BackwardProgram program = backwardProgram("sagebwd", 128, true);
  const BackwardKernelSet set =
      generateBackwardKernels(program.variant(), InputType::f16, GpuArch::sm80, program.fingerprint());
  const KernelKey &key = set.kernel.key;
  CHECK(set.kernel.role == AttentionKernelRole::backward);
  CHECK(nameOf(set.kernel.role) == "backward");
  CHECK(key.ir_hash == program.fingerprint());
  CHECK(key.schedule == set.plan.schedule);
  CHECK(key.arch == "sm_80");
  CHECK(key.head_dim == 128);
  CHECK(key.causal);
  CHECK(key.dtypes == "qkv=f16,do=f16,grads=f16");
  CHECK(key.compiler_version == nvrtcVersion());
  CHECK(key.tunables == "block_q=" + std::to_string(set.plan.block_q) + ",block_kv=" +
                            std::to_string(set.plan.block_kv) + ",warps=" + std::to_string(set.plan.warps));
  // The key hashes the self-contained text (the device library's headers are part of the module); `cache ls` shows
  // the module's name from `extra`.
  CHECK(key.extra == set.kernel.name + ";source-sha256=" + sha256Hex(selfContainedSource(set.kernel)));
  CHECK(key == backwardKernelKey(program.fingerprint(), set.plan, set.kernel.name, selfContainedSource(set.kernel)));
  CHECK(parseKernelKeyText(key.text()) == key);
  CHECK(set.plan.warps == 8); // sm_80's shared memory takes 128 keys per CTA of the main kernel
  CHECK(set.kernel.block[0] == 32 * set.plan.warps);

  // Generated again: byte-identical key (what makes a second process find the first one's disk entry).
  CHECK(backwardKernels("sagebwd", 128, true, InputType::f16, GpuArch::sm80).kernel.key.digest() == key.digest());

  // Each thing the module depends on changes the digest.
  std::set<std::string> digests{key.digest()};
  for (const BackwardKernelSet &other : {backwardKernels("sagebwd", 64, true, InputType::f16, GpuArch::sm80),
                                         backwardKernels("sagebwd", 128, false, InputType::f16, GpuArch::sm80),
                                         backwardKernels("sagebwd", 128, true, InputType::bf16, GpuArch::sm80),
                                         backwardKernels("sagebwd", 128, true, InputType::f16, GpuArch::sm89)})
    CHECK(digests.insert(other.kernel.key.digest()).second);
  // The IR fingerprint alone (same source) changes it too.
  CHECK(generateBackwardKernels(program.variant(), InputType::f16, GpuArch::sm80, "").kernel.key.digest() !=
        key.digest());
  // A different plan of the same variant (another tile) is another key, even with the source held fixed.
  schedules::BackwardKernelPlan other_plan = set.plan;
  other_plan.block_kv *= 2;
  CHECK(backwardKernelKey(program.fingerprint(), other_plan, set.kernel.name, selfContainedSource(set.kernel)) != key);
}

TEST_CASE("the SLA module's key: head dim, feature map and arch change it; it differs from the sparse part's") {
  const AttentionVariant variant = slaVariant("sla-f16", 128);
  const GeneratedKernel module = generateSlaModule(variant, GpuArch::sm80);
  CHECK(module.role == AttentionKernelRole::sla);
  CHECK(module.key.schedule == "sla");
  CHECK(module.key.arch == "sm_80");
  CHECK(module.key.head_dim == 128);
  CHECK(module.key.tunables == "block_q=64,block_kv=64");
  CHECK(module.key.extra == module.name + ";source-sha256=" + sha256Hex(selfContainedSource(module)));
  CHECK(parseKernelKeyText(module.key.text()) == module.key);
  CHECK(generateSlaModule(variant, GpuArch::sm80).key == module.key);

  std::set<std::string> digests{module.key.digest()};
  CHECK(digests.insert(generateSlaModule(slaVariant("sla-f16", 64), GpuArch::sm80).key.digest()).second);
  CHECK(digests.insert(generateSlaModule(slaVariant("sla-f16-elu", 128), GpuArch::sm80).key.digest()).second);
  CHECK(digests.insert(generateSlaModule(variant, GpuArch::sm90a).key.digest()).second);
  CHECK(digests.insert(generateSlaModule(variant, GpuArch::sm80, "0123456789abcdef").key.digest()).second);
  // A bf16 module (bf16 Q, K, V, O): its own name, dtypes and key.
  const GeneratedKernel bf16 = generateSlaModule(variant, GpuArch::sm80, {}, schedules::InputType::bf16);
  CHECK(module.key.dtypes == "qkv=f16,o=f16");
  CHECK(bf16.key.dtypes == "qkv=bf16,o=bf16");
  CHECK(bf16.name == module.name + "_bf16");
  CHECK(digests.insert(bf16.key.digest()).second);

  // The sparse part's kernels are the forward's, keyed by attentionKernelKey: never the SLA module's key.
  AttentionVariant sparse = variant;
  sparse.sla = SlaSpec{};
  AttentionKernelRequest request;
  request.arch = GpuArch::sm80;
  for (const GeneratedKernel &kernel : generateAttentionKernels(sparse, request).kernels)
    CHECK(digests.insert(kernel.key.digest()).second);

  CHECK_THROWS_AS(generateSlaModule(dsl::preset("sage-b", 128)->build().variant(), GpuArch::sm80),
                  std::invalid_argument);
}

TEST_CASE("the backward module through the kernel cache: built once, then memory, then disk for another cache") {
  test::TemporaryDirectory directory("sagegen-auxiliary-cache");
  KernelCacheOptions options;
  options.directory = directory.path;
  const BackwardKernelSet set = backwardKernels("sagebwd", 64, false, InputType::f16, GpuArch::sm80);
  KernelCache cache(options);
  double milliseconds = -1;
  const CacheResult built = cacheKernel(cache, set.kernel, &milliseconds);
  CHECK(built.source == CacheSource::built);
  CHECK(milliseconds >= 0);
  CHECK(built.digest == set.kernel.key.digest());
  REQUIRE(built.image);
  CHECK(!built.image->empty());
  CHECK(cacheKernel(cache, set.kernel).source == CacheSource::memory);
  KernelCache other(options); // as another process on the same directory
  const CacheResult from_disk = cacheKernel(other, set.kernel);
  CHECK(from_disk.source == CacheSource::disk);
  CHECK(*from_disk.image == *built.image);
  const std::vector<CacheEntryInfo> entries = other.list();
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].valid);
  CHECK(entries[0].key_text == set.kernel.key.text());
}

TEST_CASE("an AOT directory lists the backward and SLA modules by key (roles backward and sla)") {
  test::TemporaryDirectory backward_directory("sagegen-auxiliary-aot-backward");
  const BackwardKernelSet set = backwardKernels("sagebwd", 64, false, InputType::f16, GpuArch::sm80);
  writeAotDirectory(backward_directory.path, set.kernel);
  std::vector<std::string> warnings;
  const AotKernelDirectory backward(backward_directory.path,
                                    [&](const std::string &warning) { warnings.push_back(warning); });
  CHECK(backward.find(set.kernel.key).outcome == AotLookupOutcome::found);
  // Another variant's module is not handed out.
  CHECK(backward.find(backwardKernels("sagebwd", 64, true, InputType::f16, GpuArch::sm80).kernel.key).outcome ==
        AotLookupOutcome::not_listed);
  REQUIRE(backward.manifest());
  CHECK(backward.manifest()->kernels.at(0).role == "backward");

  test::TemporaryDirectory sla_directory("sagegen-auxiliary-aot-sla");
  const GeneratedKernel sla = generateSlaModule(slaVariant("sla-f16", 64), GpuArch::sm80);
  writeAotDirectory(sla_directory.path, sla);
  const AotKernelDirectory sla_aot(sla_directory.path,
                                   [&](const std::string &warning) { warnings.push_back(warning); });
  CHECK(sla_aot.find(sla.key).outcome == AotLookupOutcome::found);
  CHECK(warnings.empty());
}

TEST_CASE("GPU: a second backward runner of a variant takes its module from memory, a fresh cache from disk") {
  if (test::skipWithoutGpu("runtime_auxiliary_kernels_test"))
    return;
  test::TemporaryDirectory directory("sagegen-auxiliary-runner");
  KernelCacheOptions cache_options;
  cache_options.directory = directory.path;
  KernelCache cache(cache_options);
  const ir::BackwardProgram program = backwardProgram("sagebwd", 64, false);
  BackwardRunnerOptions options;
  options.ir_fingerprint = program.fingerprint();
  options.cache = &cache;
  const AttentionBackwardRunner first(program.variant(), InputType::f16, 0, options);
  CHECK(first.kernelSource() == CacheSource::built);
  CHECK(first.describe().find("[built ") != std::string::npos);
  const AttentionBackwardRunner second(program.variant(), InputType::f16, 0, options);
  CHECK(second.kernelSource() == CacheSource::memory);
  CHECK(second.describe().find("[memory]") != std::string::npos);
  CHECK(second.kernelDigest() == first.kernelDigest());
  KernelCache fresh(cache_options);
  options.cache = &fresh;
  const AttentionBackwardRunner third(program.variant(), InputType::f16, 0, options);
  CHECK(third.kernelSource() == CacheSource::disk);
  CHECK(third.describe().find("[disk]") != std::string::npos);

  // An AOT directory with the module comes first.
  test::TemporaryDirectory aot("sagegen-auxiliary-runner-aot");
  writeAotDirectory(
      aot.path,
      generateBackwardKernels(program.variant(), InputType::f16, third.plan().arch, program.fingerprint()).kernel);
  options.aot_directory = aot.path;
  const AttentionBackwardRunner from_aot(program.variant(), InputType::f16, 0, options);
  CHECK(from_aot.kernelSource() == CacheSource::aot);
  CHECK(from_aot.describe().find("[aot]") != std::string::npos);
}

TEST_CASE("GPU: a second SLA runner takes the SLA module from memory, a fresh cache from disk") {
  if (test::skipWithoutGpu("runtime_auxiliary_kernels_test"))
    return;
  test::TemporaryDirectory directory("sagegen-auxiliary-sla");
  KernelCacheOptions cache_options;
  cache_options.directory = directory.path;
  KernelCache cache(cache_options);
  const AttentionVariant variant = slaVariant("sla-f16", 64);
  AttentionRunnerOptions options;
  options.cache = &cache;
  const SlaRunner first(variant, options);
  CHECK(first.moduleSource() == CacheSource::built);
  const SlaRunner second(variant, options);
  CHECK(second.moduleSource() == CacheSource::memory);
  CHECK(second.describe().find("[memory]; sparse part: ") != std::string::npos);
  KernelCache fresh(cache_options);
  options.cache = &fresh;
  const SlaRunner third(variant, options);
  CHECK(third.moduleSource() == CacheSource::disk);
  CHECK(third.describe().find("[disk]; sparse part: ") != std::string::npos);

  // An AOT directory with the SLA module comes first (the sparse part, not in it, comes from the cache).
  test::TemporaryDirectory aot("sagegen-auxiliary-sla-aot");
  writeAotDirectory(aot.path, generateSlaModule(variant, currentDeviceArch())); // device 0's, as the runner's
  options.aot_directory = aot.path;
  const SlaRunner from_aot(variant, options);
  CHECK(from_aot.moduleSource() == CacheSource::aot);
  CHECK(from_aot.describe().find("[aot]; sparse part: ") != std::string::npos);
}
