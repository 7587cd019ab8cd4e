// The error of a failed CUDA driver call, or of a call made where no driver is available.
#pragma once

#include <stdexcept>
#include <string>

namespace sage::runtime {

class CudaError : public std::runtime_error {
public:
  // `call` is the driver entry point (e.g. "cuModuleLoadData"); `result` its CUresult (0 when the driver
  // could not be used at all); `message` the full text, with the driver's own error string.
  CudaError(std::string call, int result, const std::string &message)
      : std::runtime_error(message), call_(std::move(call)), result_(result) {}

  const std::string &call() const { return call_; }
  int result() const { return result_; }

private:
  std::string call_;
  int result_;
};

} // namespace sage::runtime
