#include "AotEmitter.h"

#include "KernelSetOptions.h"

#include "sage/dsl/Presets.h"
#include "sage/runtime/NvrtcCompiler.h"
#include "sage/runtime/OutputPath.h"
#include "sage/runtime/Sha256.h"

#include <fmt/core.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fcntl.h>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sys/file.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

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
  // Only a regular file is replaced: a directory, device, FIFO or link planted under a kernel's name is named instead.
  if (std::optional<std::string> problem = runtime::outputPathProblem(path))
    throw UserError("-o: " + *problem);
  // Written to a fresh temporary beside the target (mkstemp: O_CREAT|O_EXCL, so a planted symlink or file of that
  // name is never followed or reused) and renamed over it, so an interrupted run never leaves half a file.
  std::string temporary = path.string() + ".tmp.XXXXXX";
  const int descriptor = ::mkstemp(temporary.data());
  if (descriptor < 0)
    throw UserError(fmt::format("-o: cannot create a temporary file for {}: {}", path.string(), std::strerror(errno)));
  ::fchmod(descriptor, 0644); // mkstemp makes 0600; the emitted set is meant to be shipped and read by others
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t count = ::write(descriptor, bytes.data() + written, bytes.size() - written);
    if (count < 0 && errno == EINTR)
      continue;
    if (count <= 0)
      break;
    written += size_t(count);
  }
  const int write_error = errno;
  if (::close(descriptor) != 0 || written != bytes.size()) {
    ::unlink(temporary.c_str());
    throw UserError(fmt::format("-o: cannot write {}: {}", temporary, std::strerror(write_error)));
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const int rename_error = errno;
    ::unlink(temporary.c_str());
    throw UserError(fmt::format("-o: cannot write {}: {}", path.string(), std::strerror(rename_error)));
  }
}

// An exclusive, non-blocking flock on the output directory itself (no lock file is left behind): a second emit into
// the same directory fails at once instead of silently replacing the first one's manifest.
class DirectoryLock {
public:
  explicit DirectoryLock(const std::filesystem::path &directory)
      : descriptor_(::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {
    if (descriptor_ < 0)
      throw UserError(fmt::format("-o: cannot open the directory {}: {}", directory.string(), std::strerror(errno)));
    if (::flock(descriptor_, LOCK_EX | LOCK_NB) != 0) {
      const int error = errno;
      ::close(descriptor_);
      throw UserError(error == EWOULDBLOCK
                          ? fmt::format("-o: another sagegen emit is writing {}; run one emit per directory at a time",
                                        directory.string())
                          : fmt::format("-o: cannot lock {}: {}", directory.string(), std::strerror(error)));
    }
  }
  ~DirectoryLock() { ::close(descriptor_); }
  DirectoryLock(const DirectoryLock &) = delete;
  DirectoryLock &operator=(const DirectoryLock &) = delete;

private:
  int descriptor_;
};

// The whole of a regular file of at most `max_bytes`, or nothing (missing, not regular, too large, unreadable).
std::optional<std::string> readSmallRegularFile(const std::filesystem::path &path, size_t max_bytes) {
  const int descriptor = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  if (descriptor < 0)
    return std::nullopt;
  struct stat status {};
  std::optional<std::string> text;
  if (::fstat(descriptor, &status) == 0 && S_ISREG(status.st_mode) && size_t(status.st_size) <= max_bytes) {
    text.emplace(size_t(status.st_size), '\0');
    size_t got = 0;
    while (got < text->size()) {
      const ssize_t count = ::read(descriptor, text->data() + got, text->size() - got);
      if (count < 0 && errno == EINTR)
        continue;
      if (count <= 0)
        break;
      got += size_t(count);
    }
    if (got != text->size())
      text.reset();
  }
  ::close(descriptor);
  return text;
}

std::string_view textOf(const runtime::ByteBuffer &bytes) {
  return {reinterpret_cast<const char *>(bytes.data()), bytes.size()};
}

// Files the directory's previous manifest listed, with the SHA-256 it gave each (empty for PTX, which it does not
// hash): emit owns those, so the ones not written again are stale and removed, if they are still what emit wrote. The
// manifest reader accepts only the names emit derives from an entry (plain names in this directory, of the kernel-file
// form with the source's hash), so a manifest cannot point emit at any other file.
std::map<std::string, std::string> previouslyEmittedFiles(const std::filesystem::path &directory) {
  std::map<std::string, std::string> files;
  if (!std::filesystem::exists(directory / runtime::kAotManifestFileName))
    return files;
  try {
    for (const runtime::AotKernelEntry &entry : runtime::loadAotManifest(directory).kernels) {
      files.emplace(entry.source_file, entry.source_sha256);
      if (!entry.ptx_file.empty())
        files.emplace(entry.ptx_file, "");
      if (!entry.cubin_file.empty())
        files.emplace(entry.cubin_file, entry.cubin_sha256);
    }
  } catch (const runtime::AotManifestError &error) {
    fmt::print(stderr, "warning: {}; leaving the files it may list in place\n", error.what());
  }
  return files;
}

// Whether the stale file `name` is still the one emit wrote: its SHA-256 matches the old manifest, or, for PTX
// (not hashed there), it is NVRTC's PTX text. A file the user replaced or planted under that name is kept.
bool stillEmitted(const std::filesystem::path &path, const std::string &sha256) {
  const std::optional<std::string> text = readSmallRegularFile(path, size_t(256) << 20);
  if (!text)
    return false;
  if (!sha256.empty())
    return runtime::sha256Hex(*text) == sha256;
  return text->starts_with("//\n// Generated by NVIDIA NVVM Compiler");
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
  std::vector<PresetKernels> generated;
  for (const EmitTarget &target : targets) {
    PresetOptions preset{target.preset, target.head_dim, target.causal, target.lse, target.packed};
    try {
      generated.push_back(generatePresetKernels(preset, target.input, target.arch, target.backward, target.tunables));
    } catch (const UserError &) {
      throw;
    } catch (const std::invalid_argument &error) {
      if (!options.skip_unsupported)
        throw UserError(target.packed ? fmt::format("--packed: --preset {} --arch {} has no packed kernels: {}",
                                                    target.preset, schedules::archName(target.arch), error.what())
                                      : fmt::format("--preset {} --arch {}: not supported: {}", target.preset,
                                                    schedules::archName(target.arch), error.what()));
      manifest.skipped.push_back({target.preset, target.head_dim, target.causal,
                                  std::string(schedules::nameOf(target.input)),
                                  std::string(schedules::archName(target.arch)), error.what(), target.packed});
    }
  }

  // The .cu files stand alone: device-library includes are inlined (the keys hash this same text).
  for (PresetKernels &kernels : generated)
    for (runtime::GeneratedKernel &kernel : kernels.kernels)
      if (kernel.uses_device_library) {
        kernel.source = runtime::selfContainedSource(kernel);
        kernel.uses_device_library = false;
      }

  std::vector<CompileJob> jobs;
  std::map<std::pair<std::string, std::string>, size_t> job_of; // (source sha256, arch) -> job
  std::map<std::string, const std::string *> sources;           // file name -> text
  std::vector<size_t> kernel_jobs;
  std::vector<bool> is_module; // a backward or SLA module: several kernels in one cubin
  for (const PresetKernels &kernels : generated) {
    for (const runtime::GeneratedKernel &kernel : kernels.kernels) {
      runtime::AotKernelEntry entry;
      entry.key_digest = kernel.key.digest();
      entry.key_text = kernel.key.text();
      entry.variant = kernels.variant;
      entry.preset = kernels.preset;
      entry.head_dim = kernels.head_dim;
      entry.causal = kernel.key.causal;
      entry.lse = kernels.lse;
      entry.packed = kernels.packed;
      entry.role = std::string(runtime::nameOf(kernel.role));
      entry.name = kernel.name;
      entry.schedule = kernel.key.schedule;
      entry.tunables = kernel.key.tunables;
      entry.arch = kernel.key.arch;
      entry.input = kernels.input;
      entry.entry_point = kernel.entry_point;
      entry.source_sha256 = runtime::sha256Hex(kernel.source);
      entry.source_file = runtime::aotSourceFileName(kernel.entry_point, entry.source_sha256);
      entry.block = {static_cast<int>(kernel.block[0]), static_cast<int>(kernel.block[1]),
                     static_cast<int>(kernel.block[2])};
      entry.grid_rule = kernel.grid_rule;
      entry.dynamic_shared_bytes = kernel.dynamic_shared_bytes;
      if (want_ptx)
        entry.ptx_file = runtime::aotImageFileName(kernel.entry_point, entry.source_sha256, entry.arch, "ptx");
      if (want_cubin)
        entry.cubin_file = runtime::aotImageFileName(kernel.entry_point, entry.source_sha256, entry.arch, "cubin");
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
      is_module.push_back(kernel.role == runtime::AttentionKernelRole::backward ||
                          kernel.role == runtime::AttentionKernelRole::sla);
      manifest.kernels.push_back(std::move(entry));
    }
  }
  runJobs(jobs, options.jobs);

  std::error_code error;
  std::filesystem::create_directories(options.directory, error);
  if (error || !std::filesystem::is_directory(options.directory))
    throw UserError(fmt::format("-o: cannot create the directory {}{}", options.directory.string(),
                                error ? ": " + error.message() : std::string()));
  const DirectoryLock lock(options.directory);
  const std::map<std::string, std::string> previous = previouslyEmittedFiles(options.directory);

  // Every target before anything is written: a refused one leaves the directory as it was.
  auto checkTarget = [&](const std::string &name) {
    if (std::optional<std::string> problem = runtime::outputPathProblem(options.directory / name))
      throw UserError("-o: " + *problem);
  };
  for (const runtime::AotKernelEntry &entry : manifest.kernels)
    for (const std::string *name : {&entry.source_file, &entry.ptx_file, &entry.cubin_file})
      if (!name->empty())
        checkTarget(*name);
  checkTarget(std::string(runtime::kAotManifestFileName));

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
    for (const runtime::KernelResources &resources : job.cubin.resources) {
      if (is_module[index]) { // every kernel of the module: the largest of each
        runtime::AotKernelResources &most = entry.resources ? *entry.resources : entry.resources.emplace();
        most.registers = std::max(most.registers, resources.registers);
        most.spill_store_bytes = std::max(most.spill_store_bytes, resources.spill_store_bytes);
        most.spill_load_bytes = std::max(most.spill_load_bytes, resources.spill_load_bytes);
        most.static_shared_bytes = std::max(most.static_shared_bytes, resources.static_shared_bytes);
        most.stack_frame_bytes = std::max(most.stack_frame_bytes, resources.stack_frame_bytes);
      } else if (resources.kernel == entry.entry_point) {
        entry.resources =
            runtime::AotKernelResources{resources.registers, resources.spill_store_bytes, resources.spill_load_bytes,
                                        resources.static_shared_bytes, resources.stack_frame_bytes};
      }
    }
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

  for (const auto &[name, sha256] : previous) {
    if (written.contains(name))
      continue;
    if (!stillEmitted(options.directory / name, sha256)) {
      if (std::filesystem::exists(std::filesystem::symlink_status(options.directory / name)))
        fmt::print(stderr, "warning: {} is listed by the old manifest but is no longer the file emit wrote: kept\n",
                   (options.directory / name).string());
      continue;
    }
    std::error_code remove_error;
    if (std::filesystem::remove(options.directory / name, remove_error))
      report.files_removed.push_back(name);
    else if (remove_error)
      throw UserError(fmt::format("-o: cannot remove the stale file {}: {}", (options.directory / name).string(),
                                  remove_error.message()));
  }
  return report;
}

} // namespace sage::tool
