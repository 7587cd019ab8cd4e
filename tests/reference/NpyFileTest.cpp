// The .npy reader on valid and hostile files (issue 10): values read exactly; overflowing shapes, headers larger
// than the file, decoys, FIFOs and malformed dicts refused before anything large is allocated, naming what was wrong.
#include "sage/reference/NpyFile.h"
#include "../support/TemporaryDirectory.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <sys/stat.h>
#include <vector>

namespace {

// A .npy file (format 1.0, or 2.0 when `version` is 2) with the given header dict and raw data bytes.
std::string npyBytes(std::string header, const std::string &data, int version = 1) {
  header += std::string(63 - (10 + header.size()) % 64, ' ') + "\n";
  std::string bytes = "\x93NUMPY";
  bytes.push_back(char(version));
  bytes.push_back('\0');
  const size_t length = header.size();
  bytes.push_back(char(length & 0xff));
  bytes.push_back(char((length >> 8) & 0xff));
  if (version == 2) {
    bytes.push_back(char((length >> 16) & 0xff));
    bytes.push_back(char((length >> 24) & 0xff));
  }
  return bytes + header + data;
}

std::string floats(const std::vector<float> &values) {
  std::string data(values.size() * 4, '\0');
  std::memcpy(data.data(), values.data(), data.size());
  return data;
}

struct NpyFiles {
  sage::test::TemporaryDirectory directory{"npy-test"};
  std::string write(const std::string &name, const std::string &bytes) {
    const std::string path = (directory.path / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
};

void checkRefused(const std::string &path, const std::string &expected) {
  CAPTURE(expected);
  CHECK_THROWS_WITH_AS(sage::reference::loadNpyTensor(path), doctest::Contains(expected.c_str()),
                       std::invalid_argument);
}

} // namespace

TEST_CASE("a valid file is read exactly, 3-D as batch 1") {
  NpyFiles files;
  std::vector<float> values(2 * 3 * 16);
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = float(i) * 0.25f - 3.0f;
  const auto tensor = sage::reference::loadNpyTensor(files.write(
      "ok.npy", npyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, 16), }", floats(values))));
  CHECK(tensor.batch() == 1);
  CHECK(tensor.heads() == 2);
  CHECK(tensor.tokens() == 3);
  CHECK(tensor.dim() == 16);
  CHECK(tensor.at(0, 1, 2, 15) == values[(1 * 3 + 2) * 16 + 15]);
  // Keys in another order, double quotes and format 2.0 are NumPy's too.
  const auto again = sage::reference::loadNpyTensor(files.write(
      "v2.npy", npyBytes(R"({"shape": (1, 2, 3, 16), "fortran_order": False, "descr": "<f4"})", floats(values), 2)));
  CHECK(again.at(0, 1, 2, 15) == values[(1 * 3 + 2) * 16 + 15]);
}

TEST_CASE("shapes that overflow or outgrow the file are refused before allocating") {
  NpyFiles files;
  checkRefused(
      files.write("overflow.npy",
                  npyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 16), }", "")),
      "more than 2^63 bytes");
  checkRefused(
      files.write("short.npy", npyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1024, 1024, 1024), }",
                                        std::string(128, '\0'))),
      "truncated data: the shape needs 4294967296 bytes, the file has 128 after the header");
  checkRefused(files.write("zero.npy", npyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 0, 16), }", "")),
               "every dimension must be positive");
  std::string huge_header = "\x93NUMPY\x02";
  huge_header += std::string("\0\xf0\xff\xff\xff{", 6);
  checkRefused(files.write("header.npy", huge_header), "header length 4294967280 exceeds the limit of 65536 bytes");
}

TEST_CASE("the header is parsed by key, not searched: decoys and malformed dicts are errors") {
  NpyFiles files;
  const std::string data = floats(std::vector<float>(16));
  checkRefused(files.write("decoy.npy", npyBytes("{'descr': '<f4', 'fortran_order': True, 'shape': (1, 1, 16), "
                                                 "'x': \"'fortran_order': False\"}",
                                                 data)),
               "unknown key 'x'");
  checkRefused(
      files.write("fortran.npy", npyBytes("{'descr': '<f4', 'fortran_order': True, 'shape': (1, 1, 16), }", data)),
      "'fortran_order': expected C order (False), got True");
  checkRefused(files.write("twice.npy", npyBytes("{'descr': '<f4', 'descr': '<f2', 'fortran_order': False, "
                                                 "'shape': (1, 1, 16), }",
                                                 data)),
               "key 'descr' repeated");
  checkRefused(
      files.write("f8.npy", npyBytes("{'descr': '<f8', 'fortran_order': False, 'shape': (1, 1, 16), }", data + data)),
      "'descr': expected float16 ('<f2') or float32 ('<f4'), got '<f8'");
  checkRefused(files.write("missing.npy", npyBytes("{'descr': '<f4', 'shape': (1, 1, 16), }", data)),
               "needs 'descr', 'fortran_order' and 'shape'");
  checkRefused(
      files.write("junk.npy", npyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 16x), }", data)),
      "expected ',' or ')' in the shape");
  // 26k spaces inside the shape overflowed std::regex's stack; the parser skips them in a loop.
  const auto spaced = sage::reference::loadNpyTensor(files.write(
      "spaces.npy",
      npyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::string(26000, ' ') + "1, 1, 16), }", data,
               2)));
  CHECK(spaced.dim() == 16);
}

TEST_CASE("only regular files are opened") {
  NpyFiles files;
  const std::string fifo = (files.directory.path / "fifo.npy").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  checkRefused(fifo, "expected a regular file");
  checkRefused("/dev/zero", "expected a regular file");
  checkRefused(files.directory.path.string(), "expected a regular file");
  checkRefused((files.directory.path / "absent.npy").string(), "cannot open");
}
