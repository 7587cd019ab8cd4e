// The real CandidateTimer of `sagegen tune`: compiles candidates with NVRTC through the kernel cache (no GPU needed,
// any thread), checks each on a small problem against the default configuration's output and the CPU reference, and
// times full calls (prologue + attention) with CUDA events.
//
// Check tolerance. Tunables change only the tiling: the order of the f16/f32 sums and where the online softmax
// rescales, never the quantization (Q/K/V codes and scales come from the same prologue). A correct candidate therefore
// sits about as far from the CPU reference of its variant as the default does; a broken one (indexing, pipeline race,
// a missed tail) is off by O(1). A candidate passes when its rel-L1 to the reference is at most 1.25 x the default's
// + 0.004 (the f16 rounding of O, as in the GPU kernel tests) and its cosine similarity to the default's output is
// at least 0.999.
#pragma once

#include "sage/ir/AttentionVariant.h"
#include "sage/runtime/AttentionRunner.h"
#include "sage/runtime/TuningSweep.h"
#include "sage/schedules/WorkspaceLayout.h"

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace sage::runtime {

struct GpuTimingOptions {
  schedules::ProblemShape bench;                         // the timed problem
  schedules::ProblemShape check{1, 2, 2, 300, 300, 128}; // the checked one (its head_dim is the variant's)
  int warmup_calls = 5;
  int timed_calls = 20; // the median of these
};

class GpuCandidateTimer : public CandidateTimer {
public:
  // `base`: input type, arch (required), IR fingerprint and cache; its tunables are ignored. Throws CudaError without
  // a GPU.
  GpuCandidateTimer(const AttentionVariant &variant, AttentionRunnerOptions base, GpuTimingOptions timing);
  ~GpuCandidateTimer() override;

  void compile(const schedules::Tunables &tunables) override;
  std::optional<std::string> check(const schedules::Tunables &tunables) override;
  double time(const schedules::Tunables &tunables) override;

private:
  struct Buffers;
  const AttentionRunner &runner(const schedules::Tunables &tunables);

  AttentionVariant variant_;
  AttentionRunnerOptions base_;
  GpuTimingOptions timing_;
  std::vector<double> reference_output_; // the CPU reference of the variant on the check problem
  std::vector<double> default_output_;   // the first checked candidate's (the default's) output
  double default_relative_l1_ = 0.0;     // its distance to the reference
  std::map<std::string, std::unique_ptr<AttentionRunner>> runners_;
  std::unique_ptr<Buffers> check_buffers_, bench_buffers_;
  std::vector<unsigned short> check_inputs_[3];
};

} // namespace sage::runtime
