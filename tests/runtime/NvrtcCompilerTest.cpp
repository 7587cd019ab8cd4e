// NVRTC: every target arch compiles without a GPU; errors carry the key and the log; options take effect.
#include "sage/runtime/NvrtcCompiler.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

using namespace sage::runtime;

namespace {

// One extern "C" kernel and one template kernel, both taking a single parameter struct by value.
const char *kTinyKernels = R"(
struct FillParams {
  int *out;
  int count;
  int base;
};

extern "C" __global__ void fill(FillParams params) {
  int index = blockIdx.x * blockDim.x + threadIdx.x;
  if (index < params.count)
    params.out[index] = params.base + index;
}

template <int Step> __global__ void fill_step(FillParams params) {
  int index = blockIdx.x * blockDim.x + threadIdx.x;
  if (index < params.count)
    params.out[index] = params.base + Step * index;
}
)";

CompileRequest tinyRequest(const std::string &arch) {
  CompileRequest request;
  request.key = "tiny-" + arch;
  request.source = kTinyKernels;
  request.name_expressions = {"fill_step<3>"};
  request.options.arch = arch;
  return request;
}

bool isElf(const ByteBuffer &image) {
  return image.size() > 4 && image[0] == 0x7f && image[1] == 'E' && image[2] == 'L' && image[3] == 'F';
}

std::string textOf(const ByteBuffer &image) { return std::string(image.begin(), image.end()); }

bool contains(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

} // namespace

TEST_CASE("NVRTC reports its version and the archs it targets") {
  std::string version = nvrtcVersion();
  CHECK(version.find('.') != std::string::npos);
  CHECK(version.find_first_not_of("0123456789.") == std::string::npos);
  std::vector<std::string> archs = NvrtcCompiler::supportedArchs();
  CHECK(!archs.empty());
  for (const std::string &arch : archs)
    CHECK(arch.starts_with("sm_"));
}

TEST_CASE("a small kernel compiles to a cubin for every target arch, without a GPU") {
  NvrtcCompiler compiler;
  for (const char *arch : {"sm_80", "sm_86", "sm_89", "sm_90a", "sm_100f", "sm_120f"}) {
    INFO("arch " << arch);
    CompileResult result = compiler.compileCubin(tinyRequest(arch));
    CHECK(isElf(result.image));
    CHECK(result.compile_milliseconds > 0);
    REQUIRE(result.lowered_names.size() == 1);
    // Itanium mangling of fill_step<3>(FillParams).
    CHECK(result.loweredName("fill_step<3>") == "_Z9fill_stepILi3EEv10FillParams");
    CHECK(contains(textOf(result.image), "fill")); // the ELF symbol table names the kernels
  }
}

TEST_CASE("PTX output targets the virtual arch and holds both entry points") {
  CompileResult result = NvrtcCompiler().compilePtx(tinyRequest("sm_90a"));
  std::string ptx = textOf(result.image);
  CHECK(contains(ptx, ".target sm_90a"));
  CHECK(contains(ptx, ".entry fill("));
  CHECK(contains(ptx, ".entry " + result.loweredName("fill_step<3>")));
  CHECK(ptx.find('\0') == std::string::npos);
}

TEST_CASE("a broken kernel throws CompileError with the key and NVRTC's log") {
  CompileRequest request = tinyRequest("sm_80");
  request.key = "sage-b/sm80/hd128/causal";
  request.source_name = "broken.cu";
  request.source = "extern \"C\" __global__ void broken(int *out) {\n  out[0] = undefined_value;\n}\n";
  request.name_expressions.clear();
  try {
    NvrtcCompiler().compileCubin(request);
    FAIL("expected a CompileError");
  } catch (const CompileError &error) {
    std::string message = error.what();
    CHECK(error.key() == request.key);
    CHECK(error.arch() == "sm_80");
    CHECK(contains(message, request.key));
    CHECK(contains(error.log(), "broken.cu(2)")); // the log line points at the offending line
    CHECK(contains(error.log(), "undefined_value"));
    CHECK(contains(message, error.log()));
  }
}

TEST_CASE("a name expression that matches no kernel is a CompileError naming it") {
  CompileRequest request = tinyRequest("sm_80");
  request.name_expressions = {"no_such_kernel<1>"};
  CHECK_THROWS_AS(NvrtcCompiler().compileCubin(request), CompileError);
}

TEST_CASE("bad requests are rejected with the argument named") {
  NvrtcCompiler compiler;
  CompileRequest request = tinyRequest("sm_70"); // Volta: no longer targeted by CUDA 13's NVRTC
  bool volta_supported = false;
  for (const std::string &arch : NvrtcCompiler::supportedArchs())
    volta_supported |= arch == "sm_70";
  if (!volta_supported)
    CHECK_THROWS_WITH_AS(compiler.compileCubin(request), doctest::Contains("CompileOptions.arch"),
                         std::invalid_argument);
  for (const char *arch : {"", "sm_", "compute_90", "sm_90x", "gfx90a", "sm90"}) {
    INFO("arch '" << arch << "'");
    CHECK_THROWS_WITH_AS(compiler.compileCubin(tinyRequest(arch)), doctest::Contains("CompileOptions.arch"),
                         std::invalid_argument);
  }
  CompileRequest no_key = tinyRequest("sm_80");
  no_key.key.clear();
  CHECK_THROWS_WITH_AS(compiler.compileCubin(no_key), doctest::Contains("CompileRequest.key"), std::invalid_argument);
  CompileRequest no_source = tinyRequest("sm_80");
  no_source.source.clear();
  CHECK_THROWS_WITH_AS(compiler.compileCubin(no_source), doctest::Contains("CompileRequest.source"),
                       std::invalid_argument);
}

TEST_CASE("fast math is off by default and changes the division when asked for") {
  CompileRequest request;
  request.key = "divide";
  request.source = "extern \"C\" __global__ void divide(float *x, float y) { x[threadIdx.x] /= y; }\n";
  request.options.arch = "sm_80";
  std::string precise = textOf(NvrtcCompiler().compilePtx(request).image);
  request.options.fast_math = true;
  std::string fast = textOf(NvrtcCompiler().compilePtx(request).image);
  CHECK(contains(precise, "div.rn.f32"));
  CHECK_FALSE(contains(precise, "div.approx"));
  CHECK(contains(fast, "div.approx"));
}

TEST_CASE("line info is optional") {
  CompileRequest request = tinyRequest("sm_80");
  CHECK_FALSE(contains(textOf(NvrtcCompiler().compilePtx(request).image), ".loc"));
  request.options.line_info = true;
  CHECK(contains(textOf(NvrtcCompiler().compilePtx(request).image), ".loc"));
}

TEST_CASE("toolkit headers are found, and extra include dirs and options are passed") {
  CompileRequest request;
  request.key = "includes";
  request.options.arch = "sm_90a";
  request.source = "#include <cuda_fp16.h>\n#include \"sage_test_constant.h\"\n"
                   "extern \"C\" __global__ void k(__half *x) { x[0] = __float2half(float(SAGE_TEST_CONSTANT * "
                   "EXTRA_FACTOR)); }\n";
  std::string pattern = (std::filesystem::temp_directory_path() / "sagegen-nvrtc-test.XXXXXX").string();
  REQUIRE(::mkdtemp(pattern.data()) != nullptr);
  std::filesystem::path include_dir = pattern;
  std::ofstream(include_dir / "sage_test_constant.h") << "#define SAGE_TEST_CONSTANT 7\n";
  request.options.include_dirs = {include_dir.string()};
  request.options.extra_options = {"-DEXTRA_FACTOR=3"};
  CompileResult result = NvrtcCompiler().compilePtx(request);
  CHECK(contains(textOf(result.image), ".entry k("));
  std::filesystem::remove_all(include_dir);

  CHECK(!NvrtcCompiler::defaultToolkitIncludeDirs().empty());
  ::setenv("SAGEGEN_CUDA_INCLUDE", "/first/include:/second/include", 1);
  CHECK(NvrtcCompiler::defaultToolkitIncludeDirs() == std::vector<std::string>{"/first/include", "/second/include"});
  ::unsetenv("SAGEGEN_CUDA_INCLUDE");
}

TEST_CASE("resource usage comes from ptxas's report: static shared memory as declared") {
  CompileRequest request;
  request.key = "resources";
  request.options.arch = "sm_90a";
  request.options.report_resources = true;
  request.source = "extern \"C\" __global__ void staged(float *x) {\n"
                   "  __shared__ float tile[1024];\n" // 1024 floats: 4096 bytes of static smem
                   "  tile[threadIdx.x] = x[threadIdx.x];\n"
                   "  __syncthreads();\n"
                   "  x[threadIdx.x] = tile[1023 - threadIdx.x];\n"
                   "}\n";
  CompileResult result = NvrtcCompiler().compileCubin(request);
  REQUIRE(result.resources.size() == 1);
  CHECK(result.resources[0].kernel == "staged");
  CHECK(result.resources[0].static_shared_bytes == 4096);
  CHECK(result.resources[0].registers > 0);
  CHECK(result.resources[0].registers <= 255);
  CHECK(result.resources[0].barriers == 1);
  CHECK(result.resources[0].spill_store_bytes == 0);
}
