// Which head dim a call runs at (issue 28): the caller's, or the caller's zero-padded to one with a kernel or with a
// faster kernel. Zero-padding Q, K and V along the head dim is exact: the zero channels add nothing to Q.K^T or to
// O, and the quantizers' statistics of the real channels do not change (per-block maxima, K's channel means; a zero
// channel gets a zero mean and code 0). The caller then folds its softmax scale into Q and cuts O's padded channels.
// The schedules' own supports() decide which dims have kernels: nothing is mirrored here.
#pragma once

#include "sage/schedules/GpuArch.h"
#include "sage/schedules/InputType.h"

#include <cstdint>
#include <string_view>

namespace sage::runtime {

struct HeadDimRequest {
  std::string_view preset; // a forward preset name ("sage-b")
  int head_dim = 0;
  int64_t tokens_kv = 0;
  schedules::GpuArch arch = schedules::GpuArch::sm90a;
  schedules::InputType input = schedules::InputType::f16;
  bool block_mask = false;        // the call passes one: its granularity is the schedule's, never padded
  std::string_view schedule = {}; // a forced schedule ($SAGEGEN_SCHEDULE), empty: every schedule, ranked
};

// The head dim to run the call at. Unchanged: a dim some schedule runs (unless a padded one moves a measured preset
// to a more preferred schedule, below), a block-sparse call, a dim that is not a multiple of 8 in [8, 256], an unknown
// preset (each the runner's to refuse). Else the next multiple of 8 some schedule runs: on sm_90a the measured
// presets (sage-b, sage2-fp8) go to the wgmma schedule's next dim whenever their own dim has no kernel, and with
// >= 4096 keys also when it has one on the mma.sync schedule (H200, 2026-11-29, runs 34-35: d 48-112 padded ran
// 1.00-1.28x cuDNN at 16k tokens where the mma.sync kernels at the real d ran 0.40-0.68x; at 1k keys the padding's
// copies made sage-b slower; sage-b at d 32 was no faster padded). Since the wgmma schedule has tiles for 192 and 256,
// the same rule sends d 136..248 there (160 -> 192: 1.2x the work, against mma.sync kernels at the real d that ran
// 0.46-0.59x cuDNN for sage-b, run 35; chosen by that work ratio, not yet measured padded).
int runHeadDim(const HeadDimRequest &request);

} // namespace sage::runtime
