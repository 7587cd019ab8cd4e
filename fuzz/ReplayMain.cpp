// For builds without libFuzzer (GCC, the sanitizer job): runs a fuzz target once on every file named on the command
// line or found in a directory named there, so the seed corpus and every crash a fuzzer found stay regression tests.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv) {
  std::vector<std::filesystem::path> inputs;
  for (int index = 1; index < argc; ++index) {
    const std::filesystem::path path = argv[index];
    if (std::filesystem::is_directory(path)) {
      for (const auto &entry : std::filesystem::directory_iterator(path))
        if (entry.is_regular_file() && entry.path().filename() != "README.md")
          inputs.push_back(entry.path());
    } else {
      inputs.push_back(path);
    }
  }
  for (const std::filesystem::path &path : inputs) {
    std::ifstream file(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t *>(bytes.data()), bytes.size());
  }
  std::printf("replayed %zu inputs\n", inputs.size());
  return inputs.empty() ? 1 : 0; // an empty corpus means the paths are wrong, not that all is well
}
