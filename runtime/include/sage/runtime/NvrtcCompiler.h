// Compiles CUDA C++ source text to a cubin (or PTX) with NVRTC. Needs no GPU: CI compiles every kernel for
// every arch. Errors carry the kernel's key and NVRTC's full log.
#pragma once

#include "sage/runtime/Bytes.h"
#include "sage/runtime/PtxasResources.h"

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sage::runtime {

struct CompileOptions {
  std::string arch; // a real arch: "sm_80", "sm_86", "sm_89", "sm_90a", "sm_100f", "sm_120f", ...
  std::string cxx_standard = "c++17";
  bool fast_math = false;                // --use_fast_math approximates exp2/division: changes results, so opt-in
  bool line_info = false;                // -lineinfo, for profilers
  bool report_resources = false;         // -Xptxas -v: registers, spills and smem per kernel (CompileResult::resources)
  std::vector<std::string> include_dirs; // searched before the toolkit's headers
  std::vector<std::string> extra_options; // passed to NVRTC as they are
};

struct CompileRequest {
  std::string key;                           // names the kernel in errors (a cache key's text or a readable name)
  std::string source;                        // the CUDA C++ text
  std::string source_name = "kernel.cu";     // the file name NVRTC's messages use
  std::vector<std::string> name_expressions; // C++ kernels to lower, e.g. "attention<128>"; extern "C" needs none
  // Headers the source may #include, by include name: (name, text), e.g. the device library (DeviceLibrary.h).
  std::vector<std::pair<std::string, std::string>> headers;
  CompileOptions options;
};

struct CompileResult {
  ByteBuffer image; // the cubin, or the PTX text (without a trailing NUL)
  std::string log;  // NVRTC's log, warnings (and the ptxas report when asked) included
  std::vector<std::pair<std::string, std::string>> lowered_names; // name expression -> mangled kernel name
  std::vector<KernelResources> resources;                         // filled when options.report_resources
  double compile_milliseconds = 0;

  // The mangled name of a name expression of the request; throws std::invalid_argument for others.
  const std::string &loweredName(std::string_view name_expression) const;
};

// NVRTC rejected the source or the options. what() holds the key, the arch and the full log.
class CompileError : public std::runtime_error {
public:
  CompileError(std::string key, std::string arch, std::string log, const std::string &message)
      : std::runtime_error(message), key_(std::move(key)), arch_(std::move(arch)), log_(std::move(log)) {}
  const std::string &key() const { return key_; }
  const std::string &arch() const { return arch_; }
  const std::string &log() const { return log_; }

private:
  std::string key_, arch_, log_;
};

class NvrtcCompiler {
public:
  // Uses defaultToolkitIncludeDirs() for the CUDA headers.
  NvrtcCompiler();
  explicit NvrtcCompiler(std::vector<std::string> toolkit_include_dirs);

  CompileResult compileCubin(const CompileRequest &request) const;
  CompileResult compilePtx(const CompileRequest &request) const;

  const std::vector<std::string> &toolkitIncludeDirs() const { return toolkit_include_dirs_; }

  // $SAGEGEN_CUDA_INCLUDE (directories separated by ':') if set, otherwise the toolkit found at configure time.
  static std::vector<std::string> defaultToolkitIncludeDirs();
  // The real archs this NVRTC can target, e.g. {"sm_75", "sm_80", ..., "sm_120"}.
  static std::vector<std::string> supportedArchs();

private:
  enum class Target { cubin, ptx };
  CompileResult compile(const CompileRequest &request, Target target) const;

  std::vector<std::string> toolkit_include_dirs_;
};

// NVRTC's version, e.g. "13.0": part of every cache key.
std::string nvrtcVersion();

} // namespace sage::runtime
