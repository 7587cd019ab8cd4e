#include "HeadDimChoice.h"

#include "sage/dsl/Presets.h"
#include "sage/schedules/ScheduleRegistry.h"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

namespace sage::runtime {
namespace {

constexpr int kMaxHeadDim = 256;
constexpr int kRowElements = 8; // 16-byte rows of f16/bf16: the prologue reads 8 elements at a time
constexpr int64_t kPadFromKvTokens = 4096;

// The presets whose padded calls were measured, and the dims measured no faster padded (HeadDimChoice.h).
struct MeasuredPadding {
  std::string_view preset;
  std::vector<int> keep;
};
const std::vector<MeasuredPadding> &measuredPadding() {
  static const std::vector<MeasuredPadding> table{{"sage-b", {32}}, {"sage2-fp8", {}}};
  return table;
}

class Ranking {
public:
  Ranking(const HeadDimRequest &request, std::vector<const schedules::Schedule *> ranked)
      : request_(request), ranked_(std::move(ranked)) {}

  // The position (0: most preferred) of the best schedule that runs the preset at `head_dim`; nullopt: none does.
  // A dim the DSL refuses for a variant (e.g. not a multiple of 16) has no kernel either.
  std::optional<size_t> rankOf(int head_dim) const {
    std::optional<AttentionVariant> described;
    try {
      if (const std::optional<dsl::AttentionBuilder> builder = dsl::preset(request_.preset, head_dim))
        described = builder->describe();
    } catch (const std::invalid_argument &) {
    }
    if (!described)
      return std::nullopt;
    const AttentionVariant &variant = *described;
    for (size_t i = 0; i < ranked_.size(); ++i)
      if (ranked_[i]->supports(variant, request_.arch, request_.input))
        return i;
    return std::nullopt;
  }

private:
  const HeadDimRequest &request_;
  std::vector<const schedules::Schedule *> ranked_;
};

} // namespace

int runHeadDim(const HeadDimRequest &request) {
  const int d = request.head_dim;
  if (request.block_mask || d % kRowElements != 0 || d < kRowElements || d > kMaxHeadDim ||
      !dsl::preset(request.preset, 128))
    return d;
  std::vector<const schedules::Schedule *> schedules;
  if (request.schedule.empty())
    schedules = schedules::rankSchedules(schedules::allSchedules(), request.arch);
  else if (const schedules::Schedule *forced = schedules::findSchedule(request.schedule))
    schedules = {forced};
  else
    return d; // an unknown schedule: the runner names it
  const Ranking ranking(request, std::move(schedules));
  const std::optional<size_t> own = ranking.rankOf(d);

  const auto measured = std::find_if(measuredPadding().begin(), measuredPadding().end(),
                                     [&](const MeasuredPadding &entry) { return entry.preset == request.preset; });
  if (request.schedule.empty() && schedules::hasWgmma(request.arch) && measured != measuredPadding().end() &&
      (!own || *own > 0)) {
    // The next dim the most preferred schedule runs the preset at, where it is not the one that runs d.
    for (int padded = d + kRowElements; padded <= kMaxHeadDim; padded += kRowElements)
      if (const std::optional<size_t> rank = ranking.rankOf(padded); rank && *rank == 0) {
        const bool kept = std::find(measured->keep.begin(), measured->keep.end(), d) != measured->keep.end();
        if (!own || (request.tokens_kv >= kPadFromKvTokens && !kept))
          return padded;
        break;
      }
  }
  if (own)
    return d;
  for (int padded = d + kRowElements; padded <= kMaxHeadDim; padded += kRowElements)
    if (ranking.rankOf(padded))
      return padded;
  return d;
}

} // namespace sage::runtime
