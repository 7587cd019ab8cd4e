// The host work of a warm C call (issue 24: the host path per call), counted without a GPU: the process loads the
// counting stand-in for libcuda.so.1 (FakeCudaDriver.c, through this test's LD_LIBRARY_PATH; compute capability
// 9.0, so the sm90 schedule with its TMA tensor maps), the kernels are compiled by NVRTC and "loaded" as handles, and
// launches do nothing. A repeated sage_attention_run / sage_attention_run_varlen with the same tensors makes no host
// allocation and encodes no tensor map; a new V or workspace encodes only the maps that read it.
#include "sage/sage_c.h"

#include <doctest/doctest.h>

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>

namespace {

std::atomic<long> allocations{0};
thread_local bool counting_allocations = false;

} // namespace

// Every allocation of the process goes through these (the library's too): counted while the test asks.
void *operator new(std::size_t bytes) {
  if (counting_allocations)
    ++allocations;
  if (void *pointer = std::malloc(bytes ? bytes : 1))
    return pointer;
  throw std::bad_alloc();
}
void operator delete(void *pointer) noexcept { std::free(pointer); }
void operator delete(void *pointer, std::size_t) noexcept { std::free(pointer); }

namespace {

struct Counts {
  long calls, launches, memsets, encodes, context_calls;
};

const Counts &driverCounts() {
  void *fake = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  REQUIRE_MESSAGE(fake != nullptr, "libcuda.so.1 is not loaded: the library found no driver");
  void *symbol = dlsym(fake, "sagegen_fake_cuda_counts");
  REQUIRE_MESSAGE(symbol != nullptr, "the loaded libcuda.so.1 is not the test's fake (LD_LIBRARY_PATH?)");
  using CountsFunction = const Counts *(*)();
  return *reinterpret_cast<CountsFunction>(symbol)();
}

// What one call added to the driver's counts and to the process's allocations.
struct CallCost {
  Counts driver{};
  long allocations = 0;
};

template <class Call> CallCost cost(Call &&call) {
  const Counts before = driverCounts();
  const long allocated = allocations.load();
  counting_allocations = true;
  const sage_status status = call();
  counting_allocations = false;
  REQUIRE_MESSAGE(status == SAGE_OK, sage_last_error());
  const Counts &after = driverCounts();
  return {{after.calls - before.calls, after.launches - before.launches, after.memsets - before.memsets,
           after.encodes - before.encodes, after.context_calls - before.context_calls},
          allocations.load() - allocated};
}

void print(const char *what, const CallCost &c) {
  std::printf("runtime_host_path_test: %-34s driver calls %ld (launches %ld, memsets %ld, tensor map encodes %ld, "
              "context %ld), host allocations %ld\n",
              what, c.driver.calls, c.driver.launches, c.driver.memsets, c.driver.encodes, c.driver.context_calls,
              c.allocations);
}

// The library's own host time per warm call (the stand-in driver's calls cost next to nothing): printed, not checked
// (machines differ); the median of 9 rounds of 2000 calls.
template <class Call> void printTime(const char *what, Call &&call) {
  std::array<double, 9> rounds{};
  for (double &round : rounds) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 2000; ++i)
      REQUIRE(call() == SAGE_OK);
    round = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / 2000;
  }
  std::sort(rounds.begin(), rounds.end());
  std::printf("runtime_host_path_test: %s, library host time per warm call %.2f us (median of 9 x 2000 calls)\n", what,
              rounds[4]);
}

// Fake device addresses (never dereferenced: launches do nothing), far apart and 256-byte aligned.
void *address(std::uintptr_t slot) { return reinterpret_cast<void *>(0x100000000000ull + slot * 0x10000000ull); }

sage_tensor_desc tensor(void *data, int ndim, std::initializer_list<long long> shape, sage_dtype dtype) {
  sage_tensor_desc desc{};
  desc.data = data;
  desc.ndim = ndim;
  int i = 0;
  for (long long size : shape)
    desc.shape[i++] = size;
  long long step = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    desc.strides[d] = step;
    step *= desc.shape[d];
  }
  desc.dtype = dtype;
  desc.device = 0;
  return desc;
}

sage_attention_t createSageB() {
  sage_attention_config config{};
  config.preset = "sage-b";
  config.head_dim = 128;
  config.dtype = SAGE_DTYPE_F16;
  config.device = 0;
  sage_attention_t attention = nullptr;
  REQUIRE_MESSAGE(sage_attention_create(&config, &attention) == SAGE_OK, sage_last_error());
  return attention;
}

} // namespace

TEST_CASE("a warm dense call: no host allocation, no tensor map encoded again, the same launches") {
  sage_attention_t attention = createSageB();
  sage_tensor_desc q = tensor(address(1), 4, {1, 8, 128, 128}, SAGE_DTYPE_F16), k = q, v = q, o = q;
  k.data = address(2);
  v.data = address(3);
  o.data = address(4);
  size_t bytes = 0;
  REQUIRE(sage_attention_workspace_bytes(attention, SAGE_LAYOUT_HND, &q, &k, &bytes) == SAGE_OK);
  sage_run_args args{};
  args.layout = SAGE_LAYOUT_HND;
  args.phase = SAGE_PHASE_ALL;
  args.causal_alignment = SAGE_CAUSAL_BOTTOM_RIGHT;
  args.q = &q;
  args.k = &k;
  args.v = &v;
  args.o = &o;
  args.workspace = address(5);
  args.workspace_bytes = bytes;
  const auto run = [&] { return sage_attention_run(attention, &args); };

  const CallCost first = cost(run);
  print("dense, first call", first);
  CHECK(first.driver.encodes == 3); // Q, K and V: the fake GPU is an sm90 one
  const CallCost warm = cost(run);
  print("dense, repeated call", warm);
  CHECK(warm.allocations == 0);
  CHECK(warm.driver.encodes == 0);
  CHECK(warm.driver.launches == first.driver.launches);
  CHECK(warm.driver.memsets == first.driver.memsets);
  CHECK(warm.driver.launches + warm.driver.memsets <= 3); // the prologue, the attention kernel, at most one memset
  // Every driver call of a warm call is a launch, a memset or the context's (asked, and made current only if not).
  CHECK(warm.driver.calls == warm.driver.launches + warm.driver.memsets + warm.driver.context_calls);
  CHECK(warm.driver.context_calls <= 3);

  v.data = address(6); // the next layer's V: only the map that reads it (if any) is encoded again
  const CallCost new_v = cost(run);
  print("dense, another V", new_v);
  CHECK(new_v.driver.encodes <= 1);
  CHECK(new_v.allocations == 0);
  args.workspace = address(7); // another workspace: the maps of its Q and K codes
  const CallCost new_workspace = cost(run);
  print("dense, another workspace", new_workspace);
  CHECK(new_workspace.driver.encodes >= 2);
  CHECK(new_workspace.driver.encodes <= 3);
  CHECK(cost(run).driver.encodes == 0);
  printTime("dense", run);
  sage_attention_destroy(attention);
}

TEST_CASE("a warm packed (varlen) call: no host allocation, no tensor map encoded again") {
  sage_attention_t attention = createSageB();
  constexpr long long sequences = 2, tokens = 128, heads = 8, d = 128;
  sage_tensor_desc q = tensor(address(11), 3, {sequences * tokens, heads, d}, SAGE_DTYPE_F16), k = q, v = q, o = q;
  k.data = address(12);
  v.data = address(13);
  o.data = address(14);
  sage_tensor_desc cu_q = tensor(address(15), 1, {sequences + 1}, SAGE_DTYPE_I32), cu_kv = cu_q;
  cu_kv.data = address(16);
  size_t bytes = 0;
  REQUIRE(sage_attention_varlen_workspace_bytes(attention, sequences, heads, heads, tokens, tokens, &bytes) == SAGE_OK);
  sage_varlen_args args{};
  args.causal_alignment = SAGE_CAUSAL_BOTTOM_RIGHT;
  args.q = &q;
  args.k = &k;
  args.v = &v;
  args.o = &o;
  args.cu_seqlens_q = &cu_q;
  args.cu_seqlens_kv = &cu_kv;
  args.max_seqlen_q = args.max_seqlen_kv = tokens;
  args.workspace = address(17);
  args.workspace_bytes = bytes;
  const auto run = [&] { return sage_attention_run_varlen(attention, &args); };

  const CallCost first = cost(run);
  print("varlen, first call", first);
  CHECK(first.driver.encodes == 3);
  const CallCost warm = cost(run);
  print("varlen, repeated call", warm);
  CHECK(warm.allocations == 0);
  CHECK(warm.driver.encodes == 0);
  CHECK(warm.driver.launches == first.driver.launches);
  CHECK(warm.driver.calls == warm.driver.launches + warm.driver.memsets + warm.driver.context_calls);
  printTime("varlen", run);
  sage_attention_destroy(attention);
}
