#include "sage/reference/NpyFile.h"

#include "sage/numerics/CheckedSize.h"
#include "sage/numerics/Quantizers.h"
#include "sage/reference/RegularFile.h"

#include <charconv>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <vector>

namespace sage::reference {
namespace {

// NumPy itself refuses headers over 10000 bytes by default; a sample's header is ~120.
constexpr uint32_t kMaxHeaderBytes = 65536;

[[noreturn]] void fail(const std::string &path, const std::string &what) {
  throw std::invalid_argument("npy file '" + path + "': " + what);
}

struct NpyHeader {
  std::optional<std::string> descr;
  std::optional<bool> fortran_order;
  std::optional<std::vector<int64_t>> shape;
};

// The header is a Python dict literal with exactly the keys 'descr', 'fortran_order' and 'shape'. It is parsed by
// hand, key by key, so that a decoy such as a second "'fortran_order': False" inside a string cannot be mistaken for
// the real entry, and so that no regex backtracks on untrusted text.
class HeaderParser {
public:
  HeaderParser(const std::string &path, std::string_view text) : path_(path), text_(text) {}

  NpyHeader parse() {
    NpyHeader header;
    expect('{');
    while (true) {
      skipSpace();
      if (peek() == '}')
        break;
      const size_t key_at = at_;
      std::string key = parseString();
      expect(':');
      if (key == "descr" && !header.descr)
        header.descr = parseString();
      else if (key == "fortran_order" && !header.fortran_order)
        header.fortran_order = parseBool();
      else if (key == "shape" && !header.shape)
        header.shape = parseShape();
      else
        error(key_at, (key == "descr" || key == "fortran_order" || key == "shape") ? "key '" + key + "' repeated"
                                                                                   : "unknown key '" + key +
                                                                                         "' (expected 'descr', "
                                                                                         "'fortran_order', 'shape')");
      skipSpace();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      if (peek() != '}')
        error(at_, "expected ',' or '}'");
    }
    ++at_;
    skipSpace();
    if (at_ != text_.size())
      error(at_, "unexpected text after the header's dict");
    if (!header.descr || !header.fortran_order || !header.shape)
      error(at_, "the header needs 'descr', 'fortran_order' and 'shape'");
    return header;
  }

private:
  [[noreturn]] void error(size_t position, const std::string &what) {
    fail(path_, "header byte " + std::to_string(position) + ": " + what);
  }
  char peek() const { return at_ < text_.size() ? text_[at_] : '\0'; }
  void skipSpace() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\n' || text_[at_] == '\t'))
      ++at_;
  }
  void expect(char c) {
    skipSpace();
    if (peek() != c)
      error(at_, std::string("expected '") + c + "'");
    ++at_;
  }
  std::string parseString() {
    skipSpace();
    const char quote = peek();
    if (quote != '\'' && quote != '"')
      error(at_, "expected a quoted string");
    const size_t end = text_.find(quote, at_ + 1);
    if (end == std::string_view::npos)
      error(at_, "unterminated string");
    std::string value(text_.substr(at_ + 1, end - at_ - 1));
    at_ = end + 1;
    return value;
  }
  bool parseBool() {
    skipSpace();
    for (auto [word, value] : {std::pair{std::string_view("True"), true}, std::pair{std::string_view("False"), false}})
      if (text_.substr(at_, word.size()) == word) {
        at_ += word.size();
        return value;
      }
    error(at_, "expected True or False");
  }
  std::vector<int64_t> parseShape() {
    expect('(');
    std::vector<int64_t> shape;
    while (true) {
      skipSpace();
      if (peek() == ')')
        break;
      int64_t extent = 0;
      auto [end, problem] = std::from_chars(text_.data() + at_, text_.data() + text_.size(), extent);
      if (problem != std::errc() || end == text_.data() + at_)
        error(at_, "expected a dimension (a non-negative integer below 2^63)");
      at_ = static_cast<size_t>(end - text_.data());
      shape.push_back(extent);
      if (shape.size() > 8)
        error(at_, "more than 8 dimensions");
      skipSpace();
      if (peek() == ',')
        ++at_;
      else if (peek() != ')')
        error(at_, "expected ',' or ')' in the shape");
    }
    ++at_;
    return shape;
  }

  const std::string &path_;
  std::string_view text_;
  size_t at_ = 0;
};

} // namespace

HostTensor loadNpyTensor(const std::string &path) {
  RegularFile file(path, "npy file");
  unsigned char magic[8];
  if (!file.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    fail(path, "not a .npy file (bad magic)");
  const int major = magic[6];
  uint32_t header_bytes = 0;
  unsigned char size[4] = {0, 0, 0, 0};
  if (major == 1) {
    if (!file.read(size, 2))
      fail(path, "truncated header length");
  } else if (major == 2 || major == 3) {
    if (!file.read(size, 4))
      fail(path, "truncated header length");
  } else {
    fail(path, "unsupported .npy version " + std::to_string(major) + " (expected 1, 2 or 3)");
  }
  header_bytes = size[0] | (size[1] << 8) | (size[2] << 16) | (static_cast<uint32_t>(size[3]) << 24);
  if (header_bytes > kMaxHeaderBytes)
    fail(path, "header length " + std::to_string(header_bytes) + " exceeds the limit of " +
                   std::to_string(kMaxHeaderBytes) + " bytes");
  if (header_bytes > file.remaining())
    fail(path, "truncated header: it claims " + std::to_string(header_bytes) + " bytes, the file has " +
                   std::to_string(file.remaining()) + " left");
  std::string header_text(header_bytes, '\0');
  if (!file.read(header_text.data(), header_bytes))
    fail(path, "truncated header");
  NpyHeader header = HeaderParser(path, header_text).parse();
  const bool half = *header.descr == "<f2";
  if (!half && *header.descr != "<f4")
    fail(path, "'descr': expected float16 ('<f2') or float32 ('<f4'), got '" + *header.descr + "'");
  if (*header.fortran_order)
    fail(path, "'fortran_order': expected C order (False), got True");
  std::vector<int64_t> shape = *header.shape;
  if (shape.size() == 3)
    shape.insert(shape.begin(), 1);
  if (shape.size() != 4)
    fail(path, "'shape': expected a 4-D [batch, heads, tokens, dim] or 3-D [heads, tokens, dim] array");
  for (int64_t extent : shape)
    if (extent <= 0)
      fail(path, "'shape': every dimension must be positive");

  // The data must be in the file before anything is allocated for it.
  const int64_t element_bytes = half ? 2 : 4;
  const std::optional<int64_t> data_bytes =
      numerics::checkedProduct({shape[0], shape[1], shape[2], shape[3], element_bytes});
  if (!data_bytes || *data_bytes > file.remaining())
    fail(path, "truncated data: the shape needs " +
                   (data_bytes ? std::to_string(*data_bytes) + " bytes" : std::string("more than 2^63 bytes")) +
                   ", the file has " + std::to_string(file.remaining()) + " after the header");
  HostTensor tensor(shape[0], shape[1], shape[2], shape[3], half ? StorageType::f16 : StorageType::f32, Layout::hnd);
  std::vector<unsigned char> raw(static_cast<size_t>(*data_bytes));
  if (!file.read(raw.data(), *data_bytes))
    fail(path, "truncated data: expected " + std::to_string(*data_bytes) + " bytes");
  size_t index = 0;
  for (int64_t b = 0; b < shape[0]; ++b)
    for (int64_t h = 0; h < shape[1]; ++h)
      for (int64_t t = 0; t < shape[2]; ++t)
        for (int64_t c = 0; c < shape[3]; ++c, ++index) {
          const unsigned char *bytes = &raw[index * static_cast<size_t>(element_bytes)];
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
