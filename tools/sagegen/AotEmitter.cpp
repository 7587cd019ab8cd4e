#include "AotEmitter.h"

#include "KernelSetOptions.h"

#include "sage/dsl/Presets.h"
#include "sage/runtime/NvrtcCompiler.h"
#include "sage/runtime/Sha256.h"

#include <fmt/core.h>

#include <atomic>
#include <cstdio>
#include <exception>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

namespace sage::tool {
namespace {

// One NVRTC compilation: a distinct (source, arch). Kernels with the same text for several variants (prologues
// do not depend on the mask, for instance) share it.
struct CompileJob {
  std::string name;
  std::string source_file;
  const std::string *source = nullptr;
  std::string arch;
  bool ptx = false;
  runtime::CompileResult cubin;
  runtime::ByteBuffer ptx_text;
};

std::string contentStem(const std::string &entry_point, const std::string &source_sha256) {
  return fmt::format("{}-{}", entry_point, source_sha256.substr(0, 12));
}

void runJobs(std::vector<CompileJob> &jobs, unsigned threads) {
  if (threads == 0)
    threads = std::max(1u, std::thread::hardware_concurrency());
  threads = std::min<unsigned>(threads, static_cast<unsigned>(std::max<size_t>(jobs.size(), 1)));
  std::atomic<size_t> next{0};
  std::mutex error_mutex;
  std::exception_ptr first_error;
  auto work = [&] {
    const runtime::NvrtcCompiler compiler;
    for (size_t index = next++; index < jobs.size(); index = next++) {
      CompileJob &job = jobs[index];
      try {
        runtime::CompileRequest request;
        request.key = job.name;
        request.source = *job.source;
        request.source_name = job.source_file;
        request.options.arch = job.arch;
        request.options.report_resources = true;
        job.cubin = compiler.compileCubin(request);
        if (job.ptx) {
          request.options.report_resources = false;
          job.ptx_text = compiler.compilePtx(request).image;
        }
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!first_error)
          first_error = std::current_exception();
        next = jobs.size();
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned thread = 1; thread < threads; ++thread)
    pool.emplace_back(work);
  work();
  for (std::thread &thread : pool)
    thread.join();
  if (first_error)
    std::rethrow_exception(first_error);
}

void writeFile(const std::filesystem::path &path, std::string_view bytes) {
  // Written beside the target and renamed over it, so an interrupted run never leaves half a file.
  std::filesystem::path temporary = path;
  temporary += ".tmp";
  {
    std::ofstream file(temporary, std::ios::binary | std::ios::trunc);
    file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!file.flush())
      throw UserError(fmt::format("-o: cannot write {}", temporary.string()));
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error)
    throw UserError(fmt::format("-o: cannot write {}: {}", path.string(), error.message()));
}

std::string_view textOf(const runtime::ByteBuffer &bytes) {
  return {reinterpret_cast<const char *>(bytes.data()), bytes.size()};
}

// Files the directory's previous manifest listed: emit owns them, so those not written again are stale.
std::set<std::string> previouslyEmittedFiles(const std::filesystem::path &directory) {
  std::set<std::string> files;
  if (!std::filesystem::exists(directory / runtime::kAotManifestFileName))
    return files;
  try {
    for (const runtime::AotKernelEntry &entry : runtime::loadAotManifest(directory).kernels)
      for (const std::string *file : {&entry.source_file, &entry.ptx_file, &entry.cubin_file})
        if (!file->empty())
          files.insert(*file);
  } catch (const runtime::AotManifestError &error) {
    fmt::print(stderr, "warning: {}; leaving the files it may list in place\n", error.what());
  }
  return files;
}

} // namespace

std::vector<EmitTarget> defaultEmitTargets() {
  std::vector<EmitTarget> targets;
  for (const dsl::PresetInfo &info : dsl::presets())
    for (schedules::InputType input : {schedules::InputType::f16, schedules::InputType::bf16})
      for (int head_dim : {64, 128})
        for (bool causal : {false, true})
          for (schedules::GpuArch arch :
               {schedules::GpuArch::sm80, schedules::GpuArch::sm89, schedules::GpuArch::sm90a})
            targets.push_back({std::string(info.name), head_dim, causal, false, input, arch});
  return targets;
}

EmitReport emitKernels(const std::vector<EmitTarget> &targets, const EmitOptions &options) {
  const bool want_ptx = options.format == EmitFormat::ptx || options.format == EmitFormat::all;
  const bool want_cubin = options.format == EmitFormat::cubin || options.format == EmitFormat::all;

  EmitReport report;
  runtime::AotManifest &manifest = report.manifest;
  manifest.key_format_version = runtime::kKernelKeyFormatVersion;
  manifest.sagegen_version = runtime::sagegenVersion();
  manifest.nvrtc_version = runtime::nvrtcVersion();

  // Generate everything first (cheap), then compile each distinct (source, arch) once, in parallel.
  std::vector<VariantKernels> generated;
  for (const EmitTarget &target : targets) {
    PresetOptions preset{target.preset, target.head_dim, target.causal, target.lse};
    try {
      generated.push_back(generateVariantKernels(preset, target.input, target.arch));
    } catch (const UserError &) {
      throw;
    } catch (const std::invalid_argument &error) {
      if (!options.skip_unsupported)
        throw UserError(fmt::format("--preset {} --arch {}: not supported: {}", target.preset,
                                    schedules::archName(target.arch), error.what()));
      manifest.skipped.push_back({target.preset, target.head_dim, target.causal,
                                  std::string(schedules::nameOf(target.input)),
                                  std::string(schedules::archName(target.arch)), error.what()});
    }
  }

  // The .cu files stand alone: device-library includes are inlined (the keys hash this same text).
  for (VariantKernels &kernels : generated)
    for (runtime::GeneratedKernel &kernel : kernels.set.kernels)
      if (kernel.uses_device_library) {
        kernel.source = runtime::selfContainedSource(kernel);
        kernel.uses_device_library = false;
      }

  std::vector<CompileJob> jobs;
  std::map<std::pair<std::string, std::string>, size_t> job_of; // (source sha256, arch) -> job
  std::map<std::string, const std::string *> sources;           // file name -> text
  std::vector<size_t> kernel_jobs;
  for (const VariantKernels &kernels : generated) {
    for (const runtime::GeneratedKernel &kernel : kernels.set.kernels) {
      runtime::AotKernelEntry entry;
      entry.key_digest = kernel.key.digest();
      entry.key_text = kernel.key.text();
      entry.variant = kernels.variant.name;
      entry.preset = kernels.preset;
      entry.head_dim = kernels.variant.head_dim;
      entry.causal = kernel.key.causal;
      entry.lse = kernels.variant.epilogue.write_lse;
      entry.role = std::string(runtime::nameOf(kernel.role));
      entry.name = kernel.name;
      entry.schedule = kernel.key.schedule;
      entry.tunables = kernel.key.tunables;
      entry.arch = kernel.key.arch;
      entry.input = std::string(schedules::nameOf(kernels.set.plan.input));
      entry.entry_point = kernel.entry_point;
      entry.source_sha256 = runtime::sha256Hex(kernel.source);
      const std::string stem = contentStem(kernel.entry_point, entry.source_sha256);
      entry.source_file = stem + ".cu";
      entry.block = {static_cast<int>(kernel.block[0]), static_cast<int>(kernel.block[1]),
                     static_cast<int>(kernel.block[2])};
      entry.grid_rule = kernel.grid_rule;
      entry.dynamic_shared_bytes = kernel.dynamic_shared_bytes;
      if (want_ptx)
        entry.ptx_file = fmt::format("{}.{}.ptx", stem, entry.arch);
      if (want_cubin)
        entry.cubin_file = fmt::format("{}.{}.cubin", stem, entry.arch);
      sources.emplace(entry.source_file, &kernel.source);

      auto [found, inserted] = job_of.try_emplace({entry.source_sha256, entry.arch}, jobs.size());
      if (inserted) {
        CompileJob job;
        job.name = fmt::format("{} for {}", kernel.name, entry.arch);
        job.source_file = entry.source_file;
        job.source = &kernel.source;
        job.arch = entry.arch;
        job.ptx = want_ptx;
        jobs.push_back(std::move(job));
      }
      kernel_jobs.push_back(found->second);
      manifest.kernels.push_back(std::move(entry));
    }
  }
  runJobs(jobs, options.jobs);

  std::error_code error;
  std::filesystem::create_directories(options.directory, error);
  if (error || !std::filesystem::is_directory(options.directory))
    throw UserError(fmt::format("-o: cannot create the directory {}{}", options.directory.string(),
                                error ? ": " + error.message() : std::string()));
  const std::set<std::string> previous = previouslyEmittedFiles(options.directory);

  std::set<std::string> written;
  auto write = [&](const std::string &name, std::string_view bytes) {
    if (written.insert(name).second) {
      writeFile(options.directory / name, bytes);
      ++report.files_written;
    }
  };
  for (size_t index = 0; index < manifest.kernels.size(); ++index) {
    runtime::AotKernelEntry &entry = manifest.kernels[index];
    const CompileJob &job = jobs[kernel_jobs[index]];
    for (const runtime::KernelResources &resources : job.cubin.resources)
      if (resources.kernel == entry.entry_point)
        entry.resources =
            runtime::AotKernelResources{resources.registers, resources.spill_store_bytes, resources.spill_load_bytes,
                                        resources.static_shared_bytes, resources.stack_frame_bytes};
    if (!entry.resources)
      throw std::runtime_error(fmt::format("ptxas reported no resources for {} ({})", entry.entry_point, entry.arch));
    write(entry.source_file, *sources.at(entry.source_file));
    if (want_ptx)
      write(entry.ptx_file, textOf(job.ptx_text));
    if (want_cubin) {
      entry.cubin_sha256 = runtime::sha256Hex(job.cubin.image);
      write(entry.cubin_file, textOf(job.cubin.image));
    }
  }
  write(std::string(runtime::kAotManifestFileName), runtime::writeAotManifest(manifest));

  for (const std::string &name : previous) {
    if (written.contains(name))
      continue;
    std::error_code remove_error;
    if (std::filesystem::remove(options.directory / name, remove_error))
      report.files_removed.push_back(name);
  }
  return report;
}

} // namespace sage::tool
