// libFuzzer target: the .npy reader (sage::reference::loadNpyTensor). It reads from a path, so each input is put in
// an anonymous memory file (memfd: a regular file, as the reader requires) and read through /proc/self/fd.
#include "sage/reference/NpyFile.h"

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <sys/mman.h>
#include <unistd.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const int descriptor = ::memfd_create("fuzz.npy", MFD_CLOEXEC);
  if (descriptor < 0)
    return 0;
  size_t written = 0;
  while (written < size) {
    const ssize_t count = ::write(descriptor, data + written, size - written);
    if (count <= 0)
      break;
    written += size_t(count);
  }
  if (written == size) {
    try {
      (void)sage::reference::loadNpyTensor("/proc/self/fd/" + std::to_string(descriptor));
    } catch (const std::invalid_argument &) {
    }
  }
  ::close(descriptor);
  return 0;
}
