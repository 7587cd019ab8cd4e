// The SASS of every sm120 FP4 kernel: compiled with NVRTC for sm_120a and sm_120f, each must hold the block-scaled FP4
// mma, at least as many as its PTX has mma.sync instructions, so neither matmul was lowered to anything else.
// Two readings of the cubin:
// - always (CI too): its .text sections scanned for the instruction word of OMMA (Blackwell's block-scaled FP4 mma):
//   the low 12 bits of an instruction's first 64-bit word hold its opcode, 0x47f for every OMMA.SF that cuobjdump
//   showed in these kernels (on an H100 machine's cuobjdump 13.0, 2026-11-24, all 48 cubins);
// - where cuobjdump is found (the GPU machine; not CI): `cuobjdump -sass`, whose MMA-class lines must name scale
//   factors or E2M1 operands, and whose count must equal the scan's (which keeps the scan honest).
// Run it with build-gpu/tests/runtime/runtime_sm120_kernel_sass_test (or: ctest --test-dir build -R sm120_kernel_sass).
// It prints the first block-scaled SASS line of each kernel when cuobjdump is there.
#define DOCTEST_CONFIG_IMPLEMENT
#include "Sm120Kernels.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <unistd.h>

using namespace sage;

namespace {

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

constexpr uint64_t kOpcodeMask = 0xfff;
constexpr uint64_t kOmmaOpcode = 0x47f;

template <class T> T readLittleEndian(const runtime::ByteBuffer &bytes, size_t offset) {
  REQUIRE(offset + sizeof(T) <= bytes.size());
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}

// Instructions whose opcode bits are `opcode` in the cubin's code sections (ELF64, little-endian; sm_70 and newer
// encode one instruction per 16 bytes, the opcode in the low bits of the first 8).
size_t countOpcode(const runtime::ByteBuffer &cubin, uint64_t opcode) {
  REQUIRE(cubin.size() >= 64);
  REQUIRE(std::memcmp(cubin.data(),
                      "\x7f"
                      "ELF",
                      4) == 0);
  REQUIRE(cubin[4] == 2); // ELFCLASS64
  const auto section_offset = readLittleEndian<uint64_t>(cubin, 0x28);
  const auto entry_size = readLittleEndian<uint16_t>(cubin, 0x3a);
  const auto sections = readLittleEndian<uint16_t>(cubin, 0x3c);
  const auto names_index = readLittleEndian<uint16_t>(cubin, 0x3e);
  REQUIRE(names_index < sections);
  auto header = [&](size_t index) { return static_cast<size_t>(section_offset) + index * entry_size; };
  const auto names_offset = readLittleEndian<uint64_t>(cubin, header(names_index) + 24);
  size_t count = 0;
  for (size_t index = 0; index < sections; ++index) {
    const auto name = readLittleEndian<uint32_t>(cubin, header(index));
    REQUIRE(names_offset + name < cubin.size());
    const char *section_name = reinterpret_cast<const char *>(cubin.data() + names_offset + name);
    if (std::strncmp(section_name, ".text.", 6) != 0)
      continue;
    const auto offset = readLittleEndian<uint64_t>(cubin, header(index) + 24);
    const auto size = readLittleEndian<uint64_t>(cubin, header(index) + 32);
    REQUIRE(offset + size <= cubin.size());
    for (uint64_t at = 0; at + 16 <= size; at += 16)
      if ((readLittleEndian<uint64_t>(cubin, static_cast<size_t>(offset + at)) & kOpcodeMask) == opcode)
        ++count;
  }
  return count;
}

} // namespace

TEST_CASE("every sm120 FP4 kernel's SASS holds the block-scaled FP4 mma (opcode scan; cuobjdump -sass where found)") {
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
      const size_t scanned = countOpcode(cubin, kOmmaOpcode);
      CHECK(scanned >= ptx_mmas);
      ++checked;
      if (cuobjdump.empty()) {
        std::printf("%s %s: %zu OMMA instruction words (PTX %zu mma); no cuobjdump to read their mnemonics\n",
                    kernel.source.name.c_str(), arch, scanned, ptx_mmas);
        continue;
      }
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
      CHECK(block_scaled == scanned); // the opcode scan that CI relies on reads what cuobjdump reads
      std::printf("%s %s: %zu block-scaled mma (PTX %zu, opcode scan %zu): %s\n", kernel.source.name.c_str(), arch,
                  block_scaled, ptx_mmas, scanned, first.c_str());
    }
  std::filesystem::remove_all(directory);
  CHECK(checked == (test::fullSweeps() ? 48 : 12)); // every kernel (or CI's quarter of them) for two archs
}

int main(int argc, char **argv) {
  cuobjdump = cuobjdumpPath();
  if (cuobjdump.empty())
    std::printf("%s: no cuobjdump on PATH (nor in /usr/local/cuda/bin): the opcode scan alone\n",
                std::filesystem::path(argv[0]).filename().c_str());
  doctest::Context context(argc, argv);
  return context.run();
}
