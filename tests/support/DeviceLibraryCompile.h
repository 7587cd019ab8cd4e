// NVRTC on a translation unit, with the device library's headers (codegen/device) handed to NVRTC by name as the
// runtime compiles a kernel (a source with its includes expanded compiles the same). `syntax_only` stops after the
// front end (-fdevice-syntax-only: templates are instantiated, static_asserts evaluated, no PTX); otherwise ptxas runs
// and the cubin's size is kept; `ptxas_report` adds ptxas' -v report (registers, spills, shared memory per kernel) to
// the log. The NVRTC sweeps, and the tests that check a generated kernel's Config or a header alone with
// static_asserts, use it.
#pragma once

#include "sage/codegen/DeviceLibrary.h"

#include <nvrtc.h>

#include <algorithm>
#include <atomic>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace sage::test {

struct DeviceCompileResult {
  bool compiled = false;
  size_t cubin_bytes = 0;
  std::string log; // NVRTC's log (the errors when !compiled; empty when it has nothing to say)
};

struct NvrtcCompileOptions {
  std::string file_name = "device_library_test.cu"; // the name NVRTC's messages give the source
  bool syntax_only = false;
  bool ptxas_report = false;
};

inline DeviceCompileResult compileWithNvrtc(const std::string &source, const std::string &arch,
                                            const NvrtcCompileOptions &compile_options = {}) {
  std::vector<const char *> texts, names;
  for (const codegen::DeviceHeader &header : codegen::deviceLibrary()) {
    texts.push_back(header.text.data());
    names.push_back(header.name.data());
  }
  DeviceCompileResult result;
  nvrtcProgram program = nullptr;
  if (nvrtcCreateProgram(&program, source.c_str(), compile_options.file_name.c_str(), static_cast<int>(texts.size()),
                         texts.data(), names.data()) != NVRTC_SUCCESS) {
    result.log = "nvrtcCreateProgram failed";
    return result;
  }
  const std::string architecture = "--gpu-architecture=" + arch;
  std::vector<const char *> options = {architecture.c_str(), "-std=c++17"};
  if (compile_options.syntax_only)
    options.push_back("-fdevice-syntax-only");
  if (compile_options.ptxas_report)
    options.push_back("--ptxas-options=-v");
  result.compiled = nvrtcCompileProgram(program, static_cast<int>(options.size()), options.data()) == NVRTC_SUCCESS;
  size_t log_size = 0;
  nvrtcGetProgramLogSize(program, &log_size);
  result.log.resize(log_size);
  if (log_size > 0)
    nvrtcGetProgramLog(program, result.log.data());
  while (!result.log.empty() && (result.log.back() == '\0' || result.log.back() == '\n'))
    result.log.pop_back();
  if (result.compiled && !compile_options.syntax_only)
    result.compiled = nvrtcGetCUBINSize(program, &result.cubin_bytes) == NVRTC_SUCCESS;
  nvrtcDestroyProgram(&program);
  return result;
}

// The first kernel's registers and spill-store bytes in a ptxas -v report (-1 where the report has no such line).
struct PtxasUsage {
  int registers = -1, spill_store_bytes = -1;
};
inline PtxasUsage ptxasUsage(const std::string &log) {
  PtxasUsage usage;
  std::smatch match;
  if (std::regex_search(log, match, std::regex(R"(Used (\d+) registers)")))
    usage.registers = std::stoi(match[1]);
  if (std::regex_search(log, match, std::regex(R"((\d+) bytes spill stores)")))
    usage.spill_store_bytes = std::stoi(match[1]);
  return usage;
}

// compile(item) for every item on up to 4 threads (NVRTC and ptxas are single-threaded), results in the items' order.
template <class Item, class Compile> auto compileInParallel(const std::vector<Item> &items, Compile compile) {
  std::vector<decltype(compile(items.front()))> results(items.size());
  std::atomic<size_t> next{0};
  const unsigned workers = std::max(1u, std::min(4u, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (unsigned worker = 0; worker < workers; ++worker)
    threads.emplace_back([&] {
      for (size_t index = next++; index < items.size(); index = next++)
        results[index] = compile(items[index]);
    });
  for (std::thread &thread : threads)
    thread.join();
  return results;
}

inline DeviceCompileResult compileWithDeviceLibrary(const std::string &source, const std::string &arch,
                                                    bool syntax_only) {
  NvrtcCompileOptions options;
  options.syntax_only = syntax_only;
  return compileWithNvrtc(source, arch, options);
}

} // namespace sage::test
