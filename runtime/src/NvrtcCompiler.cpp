// NVRTC driver: builds the option list, compiles, and collects the image, log, lowered names and timing.
#include "sage/runtime/NvrtcCompiler.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nvrtc.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>

#ifndef SAGEGEN_CUDA_INCLUDE_DIRS
#define SAGEGEN_CUDA_INCLUDE_DIRS "/usr/local/cuda/include"
#endif

namespace sage::runtime {
namespace {

std::vector<std::string> splitPathList(std::string_view list) {
  std::vector<std::string> parts;
  while (!list.empty()) {
    std::size_t colon = list.find(':');
    std::string_view part = list.substr(0, colon);
    if (!part.empty())
      parts.emplace_back(part);
    list = colon == std::string_view::npos ? std::string_view() : list.substr(colon + 1);
  }
  return parts;
}

struct ProgramDeleter {
  void operator()(nvrtcProgram program) const { nvrtcDestroyProgram(&program); }
};
using ProgramHandle = std::unique_ptr<std::remove_pointer_t<nvrtcProgram>, ProgramDeleter>;

std::string programLog(nvrtcProgram program) {
  std::size_t size = 0;
  if (nvrtcGetProgramLogSize(program, &size) != NVRTC_SUCCESS || size == 0)
    return {};
  std::string log(size, '\0');
  if (nvrtcGetProgramLog(program, log.data()) != NVRTC_SUCCESS)
    return {};
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n'))
    log.pop_back();
  return log;
}

// Checks "sm_<number>[a|f]" and that NVRTC targets the number; NVRTC itself rejects a suffix the arch lacks.
void validateArch(const std::string &arch) {
  std::size_t digits_end = arch.find_first_not_of("0123456789", 3);
  bool well_formed = arch.starts_with("sm_") && arch.size() > 3 && digits_end != 3 &&
                     (digits_end == std::string::npos ||
                      (digits_end + 1 == arch.size() && (arch.back() == 'a' || arch.back() == 'f')));
  if (!well_formed)
    throw std::invalid_argument(
        fmt::format("CompileOptions.arch: expected a real GPU arch such as sm_80 or sm_90a, got '{}'", arch));
  std::vector<std::string> supported = NvrtcCompiler::supportedArchs();
  std::string base = arch.substr(0, digits_end);
  if (std::find(supported.begin(), supported.end(), base) == supported.end())
    throw std::invalid_argument(fmt::format("CompileOptions.arch: NVRTC {} cannot target '{}' (it targets {})",
                                            nvrtcVersion(), arch, fmt::join(supported, ", ")));
}

} // namespace

const std::string &CompileResult::loweredName(std::string_view name_expression) const {
  for (const auto &[expression, lowered] : lowered_names)
    if (expression == name_expression)
      return lowered;
  throw std::invalid_argument(
      fmt::format("loweredName: '{}' is not a name expression of this compilation", name_expression));
}

std::string nvrtcVersion() {
  int major = 0, minor = 0;
  ::nvrtcVersion(&major, &minor);
  return fmt::format("{}.{}", major, minor);
}

NvrtcCompiler::NvrtcCompiler() : NvrtcCompiler(defaultToolkitIncludeDirs()) {}

NvrtcCompiler::NvrtcCompiler(std::vector<std::string> toolkit_include_dirs)
    : toolkit_include_dirs_(std::move(toolkit_include_dirs)) {}

std::vector<std::string> NvrtcCompiler::defaultToolkitIncludeDirs() {
  const char *override_dirs = std::getenv("SAGEGEN_CUDA_INCLUDE");
  if (override_dirs != nullptr && *override_dirs != '\0')
    return splitPathList(override_dirs);
  return splitPathList(SAGEGEN_CUDA_INCLUDE_DIRS);
}

std::vector<std::string> NvrtcCompiler::supportedArchs() {
  int count = 0;
  if (nvrtcGetNumSupportedArchs(&count) != NVRTC_SUCCESS)
    return {};
  std::vector<int> numbers(count);
  if (nvrtcGetSupportedArchs(numbers.data()) != NVRTC_SUCCESS)
    return {};
  std::vector<std::string> archs;
  for (int number : numbers)
    archs.push_back(fmt::format("sm_{}", number));
  return archs;
}

CompileResult NvrtcCompiler::compileCubin(const CompileRequest &request) const {
  return compile(request, Target::cubin);
}

CompileResult NvrtcCompiler::compilePtx(const CompileRequest &request) const { return compile(request, Target::ptx); }

CompileResult NvrtcCompiler::compile(const CompileRequest &request, Target target) const {
  if (request.key.empty())
    throw std::invalid_argument("CompileRequest.key: expected a non-empty name for the kernel");
  if (request.source.empty())
    throw std::invalid_argument(fmt::format("CompileRequest.source of '{}': expected CUDA C++ text", request.key));
  const CompileOptions &options = request.options;
  validateArch(options.arch);

  // A cubin needs the real arch; PTX is emitted for the matching virtual one (sm_90a -> compute_90a).
  std::vector<std::string> flags;
  flags.push_back("--gpu-architecture=" +
                  (target == Target::cubin ? options.arch : "compute_" + options.arch.substr(3)));
  flags.push_back("-std=" + options.cxx_standard);
  if (options.fast_math)
    flags.push_back("--use_fast_math");
  if (options.line_info)
    flags.push_back("-lineinfo");
  if (options.report_resources && target == Target::cubin)
    flags.push_back("--ptxas-options=-v");
  for (const std::string &dir : options.include_dirs)
    flags.push_back("-I" + dir);
  for (const std::string &dir : toolkit_include_dirs_)
    flags.push_back("-I" + dir);
  flags.insert(flags.end(), options.extra_options.begin(), options.extra_options.end());
  std::vector<const char *> flag_pointers;
  for (const std::string &flag : flags)
    flag_pointers.push_back(flag.c_str());

  auto fail = [&](nvrtcResult result, std::string log) -> CompileError {
    std::string message = fmt::format("NVRTC could not compile kernel '{}' for {} ({})", request.key, options.arch,
                                      nvrtcGetErrorString(result));
    if (!log.empty())
      message += ":\n" + log;
    return CompileError(request.key, options.arch, std::move(log), message);
  };

  auto start = std::chrono::steady_clock::now();
  nvrtcProgram raw_program = nullptr;
  std::vector<const char *> header_texts, header_names;
  for (const auto &[name, text] : request.headers) {
    header_names.push_back(name.c_str());
    header_texts.push_back(text.c_str());
  }
  if (nvrtcResult result =
          nvrtcCreateProgram(&raw_program, request.source.c_str(), request.source_name.c_str(),
                             static_cast<int>(header_texts.size()), header_texts.data(), header_names.data());
      result != NVRTC_SUCCESS)
    throw fail(result, {});
  ProgramHandle program(raw_program);
  for (const std::string &expression : request.name_expressions)
    if (nvrtcResult result = nvrtcAddNameExpression(program.get(), expression.c_str()); result != NVRTC_SUCCESS)
      throw fail(result, fmt::format("cannot register the name expression '{}'", expression));

  nvrtcResult compiled = nvrtcCompileProgram(program.get(), int(flag_pointers.size()), flag_pointers.data());
  CompileResult output;
  output.log = programLog(program.get());
  if (compiled != NVRTC_SUCCESS)
    throw fail(compiled, output.log);

  for (const std::string &expression : request.name_expressions) {
    const char *lowered = nullptr;
    if (nvrtcResult result = nvrtcGetLoweredName(program.get(), expression.c_str(), &lowered);
        result != NVRTC_SUCCESS || lowered == nullptr)
      throw fail(result, fmt::format("no kernel matches the name expression '{}'", expression));
    output.lowered_names.emplace_back(expression, lowered);
  }

  std::size_t size = 0;
  nvrtcResult fetched =
      target == Target::cubin ? nvrtcGetCUBINSize(program.get(), &size) : nvrtcGetPTXSize(program.get(), &size);
  if (fetched == NVRTC_SUCCESS) {
    output.image.resize(size);
    fetched = target == Target::cubin ? nvrtcGetCUBIN(program.get(), reinterpret_cast<char *>(output.image.data()))
                                      : nvrtcGetPTX(program.get(), reinterpret_cast<char *>(output.image.data()));
  }
  if (fetched != NVRTC_SUCCESS)
    throw fail(fetched, output.log);
  if (target == Target::ptx && !output.image.empty() && output.image.back() == 0)
    output.image.pop_back();

  output.compile_milliseconds =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (options.report_resources)
    output.resources = parsePtxasResources(output.log);
  return output;
}

} // namespace sage::runtime
