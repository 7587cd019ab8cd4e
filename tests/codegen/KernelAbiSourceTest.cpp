// kernelAbiSource() is KernelAbi.h's text, byte for byte.
#include "sage/codegen/KernelAbiSource.h"

#include <doctest/doctest.h>

#include <fstream>
#include <sstream>
#include <string>

TEST_CASE("the embedded ABI is the header's text") {
  std::ifstream file(SAGE_KERNEL_ABI_PATH, std::ios::binary);
  REQUIRE(file.good());
  std::stringstream text;
  text << file.rdbuf();
  CHECK(sage::codegen::kernelAbiSource() == text.str());
  CHECK(sage::codegen::kernelAbiSource().find("struct SageAttentionParams") != std::string::npos);
}
