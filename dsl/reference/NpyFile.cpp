#include "sage/reference/NpyFile.h"

#include "sage/numerics/Quantizers.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace sage::reference {
namespace {

[[noreturn]] void fail(const std::string &path, const std::string &what) {
  throw std::invalid_argument("npy file '" + path + "': " + what);
}

std::vector<int64_t> parseShape(const std::string &path, const std::string &header) {
  std::smatch match;
  if (!std::regex_search(header, match, std::regex(R"('shape'\s*:\s*\(([^)]*)\))")))
    fail(path, "the header has no 'shape'");
  std::vector<int64_t> shape;
  std::stringstream items(match[1].str());
  for (std::string item; std::getline(items, item, ',');)
    if (item.find_first_not_of(" \t") != std::string::npos)
      shape.push_back(std::stoll(item));
  return shape;
}

} // namespace

HostTensor loadNpyTensor(const std::string &path) {
  std::ifstream file(path, std::ios::binary);
  if (!file)
    fail(path, "cannot open it");
  char magic[8];
  if (!file.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    fail(path, "not a .npy file (bad magic)");
  const int major = static_cast<unsigned char>(magic[6]);
  uint32_t header_bytes = 0;
  if (major == 1) {
    unsigned char size[2];
    file.read(reinterpret_cast<char *>(size), 2);
    header_bytes = size[0] | (size[1] << 8);
  } else if (major == 2 || major == 3) {
    unsigned char size[4];
    file.read(reinterpret_cast<char *>(size), 4);
    header_bytes = size[0] | (size[1] << 8) | (size[2] << 16) | (static_cast<uint32_t>(size[3]) << 24);
  } else {
    fail(path, "unsupported .npy version " + std::to_string(major));
  }
  std::string header(header_bytes, '\0');
  if (!file.read(header.data(), header_bytes))
    fail(path, "truncated header");
  const bool half = header.find("'<f2'") != std::string::npos;
  const bool single = header.find("'<f4'") != std::string::npos;
  if (!half && !single)
    fail(path, "expected dtype float16 ('<f2') or float32 ('<f4')");
  if (header.find("'fortran_order': False") == std::string::npos)
    fail(path, "expected C order (fortran_order False)");
  std::vector<int64_t> shape = parseShape(path, header);
  if (shape.size() == 3)
    shape.insert(shape.begin(), 1);
  if (shape.size() != 4)
    fail(path, "expected a 4-D [batch, heads, tokens, dim] or 3-D [heads, tokens, dim] array");
  for (int64_t extent : shape)
    if (extent <= 0)
      fail(path, "every dimension must be positive");

  HostTensor tensor(shape[0], shape[1], shape[2], shape[3], half ? StorageType::f16 : StorageType::f32, Layout::hnd);
  const size_t count = static_cast<size_t>(shape[0] * shape[1] * shape[2] * shape[3]);
  const size_t element_bytes = half ? 2 : 4;
  std::vector<unsigned char> raw(count * element_bytes);
  if (!file.read(reinterpret_cast<char *>(raw.data()), static_cast<std::streamsize>(raw.size())))
    fail(path, "truncated data: expected " + std::to_string(raw.size()) + " bytes");
  size_t index = 0;
  for (int64_t b = 0; b < shape[0]; ++b)
    for (int64_t h = 0; h < shape[1]; ++h)
      for (int64_t t = 0; t < shape[2]; ++t)
        for (int64_t c = 0; c < shape[3]; ++c, ++index) {
          const unsigned char *bytes = &raw[index * element_bytes];
          float value;
          if (half) {
            value = numerics::halfBitsToFloat(static_cast<uint16_t>(bytes[0] | (bytes[1] << 8)));
          } else {
            uint32_t bits = bytes[0] | (bytes[1] << 8) | (bytes[2] << 16) | (static_cast<uint32_t>(bytes[3]) << 24);
            std::memcpy(&value, &bits, sizeof value);
          }
          tensor.set(b, h, t, c, value);
        }
  return tensor;
}

} // namespace sage::reference
