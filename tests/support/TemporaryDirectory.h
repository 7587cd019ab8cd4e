// A fresh directory under the system's temporary directory, removed with everything in it (permissions a test
// took away restored first) when the test is done.
#pragma once

#include <doctest/doctest.h>

#include <filesystem>
#include <stdlib.h>
#include <string>
#include <system_error>

namespace sage::test {

struct TemporaryDirectory {
  std::filesystem::path path;
  explicit TemporaryDirectory(const std::string &prefix) {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + ".XXXXXX")).string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TemporaryDirectory() {
    std::error_code error;
    std::filesystem::permissions(path, std::filesystem::perms::owner_all, std::filesystem::perm_options::add, error);
    std::filesystem::remove_all(path, error);
  }
  TemporaryDirectory(const TemporaryDirectory &) = delete;
  TemporaryDirectory &operator=(const TemporaryDirectory &) = delete;
};

} // namespace sage::test
