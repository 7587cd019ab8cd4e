// NVRTC on a translation unit that #includes the device library (codegen/device), as the runtime compiles a kernel:
// the library's headers handed to NVRTC by name. `syntax_only` stops after the front end (-fdevice-syntax-only:
// templates are instantiated, static_asserts evaluated, no PTX); otherwise ptxas runs and the cubin's size is kept.
// The tests that check a generated kernel's Config, or a header alone, with static_asserts use it.
#pragma once

#include "sage/codegen/DeviceLibrary.h"

#include <nvrtc.h>

#include <string>
#include <vector>

namespace sage::test {

struct DeviceCompileResult {
  bool compiled = false;
  size_t cubin_bytes = 0;
  std::string log; // NVRTC's log (the errors when !compiled)
};

inline DeviceCompileResult compileWithDeviceLibrary(const std::string &source, const std::string &arch,
                                                    bool syntax_only) {
  std::vector<const char *> texts, names;
  for (const codegen::DeviceHeader &header : codegen::deviceLibrary()) {
    texts.push_back(header.text.data());
    names.push_back(header.name.data());
  }
  DeviceCompileResult result;
  nvrtcProgram program = nullptr;
  if (nvrtcCreateProgram(&program, source.c_str(), "device_library_test.cu", static_cast<int>(texts.size()),
                         texts.data(), names.data()) != NVRTC_SUCCESS) {
    result.log = "nvrtcCreateProgram failed";
    return result;
  }
  const std::string architecture = "--gpu-architecture=" + arch;
  std::vector<const char *> options = {architecture.c_str(), "-std=c++17"};
  if (syntax_only)
    options.push_back("-fdevice-syntax-only");
  result.compiled = nvrtcCompileProgram(program, static_cast<int>(options.size()), options.data()) == NVRTC_SUCCESS;
  size_t log_size = 0;
  nvrtcGetProgramLogSize(program, &log_size);
  result.log.resize(log_size);
  if (log_size > 0)
    nvrtcGetProgramLog(program, result.log.data());
  if (result.compiled && !syntax_only)
    nvrtcGetCUBINSize(program, &result.cubin_bytes);
  nvrtcDestroyProgram(&program);
  return result;
}

} // namespace sage::test
