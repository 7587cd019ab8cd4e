// The SASS of every sm120 FP4 kernel: compiled with NVRTC for sm_120a and sm_120f and disassembled with
// `cuobjdump -sass`, each must hold the block-scaled FP4 mma (an MMA-class instruction on E2M1 operands with scale
// factors), at least as many as its PTX has mma.sync instructions, so neither matmul was lowered to anything else.
// Needs cuobjdump (the GPU machine has it; CI and the build machine do not): without it the program says so and
// exits 77, which CTest reports as skipped. Run it there with
//   build-gpu/tests/runtime/runtime_sm120_kernel_sass_test   (or: ctest --test-dir build -R sm120_kernel_sass)
// It prints the first block-scaled SASS line of each kernel.
#define DOCTEST_CONFIG_IMPLEMENT
#include "Sm120Kernels.h"

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <unistd.h>

using namespace sage;

namespace {

constexpr int kSkipReturnCode = 77;

std::string cuobjdumpPath() {
  const char *path = std::getenv("PATH");
  std::stringstream directories(path ? path : "");
  std::string directory;
  while (std::getline(directories, directory, ':'))
    if (!directory.empty() && std::filesystem::exists(std::filesystem::path(directory) / "cuobjdump"))
      return (std::filesystem::path(directory) / "cuobjdump").string();
  for (const char *fallback : {"/usr/local/cuda/bin/cuobjdump"})
    if (std::filesystem::exists(fallback))
      return fallback;
  return {};
}

std::string run(const std::string &command) {
  std::string output;
  FILE *pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[4096];
  while (size_t read = std::fread(buffer, 1, sizeof buffer, pipe))
    output.append(buffer, read);
  CHECK(pclose(pipe) == 0);
  return output;
}

// SASS instruction lines whose opcode is MMA-class (HMMA, IMMA, QMMA, OMMA, ...).
std::vector<std::string> mmaLines(const std::string &sass) {
  static const std::regex mma(R"(\b[A-Z]*MMA\.[A-Z0-9_.]+)");
  std::vector<std::string> lines;
  std::stringstream stream(sass);
  std::string line;
  while (std::getline(stream, line))
    if (std::regex_search(line, mma))
      lines.push_back(line);
  return lines;
}

// The block-scaled FP4 instruction, whatever its exact SASS spelling (OMMA/QMMA ...): an MMA-class opcode that
// names scale factors (.SF), their types (UE4M3/UE8M0) or E2M1 operands. These kernels issue no other mma, so an
// f16/int8 fallback (HMMA/IMMA without these) or a missing matmul shows as a shortfall against the PTX count.
bool blockScaledFp4(const std::string &line) {
  for (const char *marker : {".SF", "E2M1", "UE4M3", "UE8M0"})
    if (line.find(marker) != std::string::npos)
      return true;
  return false;
}

std::string cuobjdump;

} // namespace

TEST_CASE("every sm120 FP4 kernel's SASS holds the block-scaled FP4 mma (cuobjdump -sass)") {
  const runtime::NvrtcCompiler nvrtc;
  const std::filesystem::path directory =
      std::filesystem::temp_directory_path() / ("sagegen_sm120_sass_" + std::to_string(::getpid()));
  std::filesystem::create_directories(directory);
  int checked = 0;
  for (const test::Sm120Kernel &kernel : test::sm120Kernels())
    for (const char *arch : {"sm_120a", "sm_120f"}) {
      CAPTURE(kernel.source.name);
      CAPTURE(arch);
      const runtime::CompileRequest compile = test::sm120CompileRequest(kernel.source, arch);
      const runtime::ByteBuffer ptx = nvrtc.compilePtx(compile).image;
      const size_t ptx_mmas = test::countOccurrences(std::string(ptx.begin(), ptx.end()), kernel.mma);
      CHECK(ptx_mmas == kernel.mma_count);
      const runtime::ByteBuffer cubin = nvrtc.compileCubin(compile).image;
      const std::filesystem::path file = directory / (kernel.source.name + "_" + arch + ".cubin");
      std::ofstream(file, std::ios::binary)
          .write(reinterpret_cast<const char *>(cubin.data()), static_cast<std::streamsize>(cubin.size()));
      const std::vector<std::string> lines = mmaLines(run(cuobjdump + " -sass " + file.string() + " 2>&1"));
      size_t block_scaled = 0;
      std::string first;
      for (const std::string &line : lines)
        if (blockScaledFp4(line) && block_scaled++ == 0)
          first = line;
      if (block_scaled < ptx_mmas) { // show what ptxas made instead, once per distinct line
        std::set<std::string> seen;
        for (const std::string &line : lines)
          if (seen.insert(line.substr(line.find_first_not_of(" /0123456789abcdefx*"))).second && seen.size() <= 8)
            std::printf("  MMA-class line: %s\n", line.c_str());
      }
      CHECK(block_scaled >= ptx_mmas);
      std::printf("%s %s: %zu block-scaled mma (PTX %zu): %s\n", kernel.source.name.c_str(), arch, block_scaled,
                  ptx_mmas, first.c_str());
      ++checked;
    }
  std::filesystem::remove_all(directory);
  CHECK(checked == 48);
}

int main(int argc, char **argv) {
  cuobjdump = cuobjdumpPath();
  if (cuobjdump.empty()) {
    std::printf("%s: SKIPPED, no cuobjdump on PATH (nor in /usr/local/cuda/bin)\n",
                std::filesystem::path(argv[0]).filename().c_str());
    return kSkipReturnCode;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
