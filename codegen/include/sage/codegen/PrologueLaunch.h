// How the runtime launches a generated prologue: each kernel's grid from the problem shape, and the one
// SagePrologueParams that every launch of the prologue receives by value.
#pragma once

#include "sage/codegen/KernelAbi.h"
#include "sage/codegen/PrologueGenerator.h"
#include "sage/schedules/WorkspaceLayout.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace sage::codegen {

struct LaunchGrid {
  unsigned x = 1, y = 1, z = 1;
};

// CTAs of one role (PrologueGenerator.h lists each role's unit of work). The kernels compute the same counts
// from SageProblemSize to find their role from blockIdx.x, so both sides must change together.
int64_t prologueRoleCtas(PrologueRole role, const PrologueGeometry &geometry, const schedules::ProblemShape &shape);

// gridDim of kernel `kernel` of the prologue: x is the sum of its roles' CTA counts. Throws
// std::invalid_argument for a shape the kernels cannot take (see computeWorkspaceLayout) or a bad index.
LaunchGrid prologueGrid(const PrologueSource &prologue, size_t kernel, const schedules::ProblemShape &shape);
std::vector<LaunchGrid> prologueGrids(const PrologueSource &prologue, const schedules::ProblemShape &shape);

// Bytes at the workspace's prologue_counters that must be zero when the prologue's kernels start (one memset on the
// stream before them): the layout's whole prologue_counters slice when a kernel is one-pass, else 0.
size_t prologueCounterBytes(const PrologueSource &prologue, const schedules::WorkspaceLayout &layout);

// The f32 factor psi_Q multiplies Q by: (float)(1/sqrt(d) * log2(e)) (log2(e) only for an exp2 softmax) when
// the variant folds the softmax scale into Q, else 1. The CPU reference rounds the same double product.
float prologueQPrescale(const AttentionVariant &variant);

// Whether the prologue only copies Q and K into q_codes and k_codes: both unquantized (a cast to the input type, which
// is a copy), unscaled and unsmoothed, and V read in place (nothing else to write). Then a caller's Q and K that are
// already in that layout (PrologueTensor::inWorkspaceLayout) can be read where they are and the prologue skipped.
// Never for packed sequences.
bool prologueOnlyCopiesQk(const AttentionVariant &variant, schedules::InputType input);

// The caller's Q, K and V: device pointers and strides in elements (the head dim is contiguous). The kernels
// read 16 bytes at a time, so pointers must be 16-byte aligned and strides multiples of 8 elements.
struct PrologueTensor {
  const void *data = nullptr;
  SageTensorStrides strides{};

  // Whether its [batch][heads][tokens][head_dim] elements are laid out as q_codes / k_codes in the input type:
  // compact head-major rows, tokens a whole number of blocks (`padded_tokens`: no padding rows), 16-byte aligned.
  // The stride of a dimension of size 1 is not looked at.
  bool inWorkspaceLayout(int64_t batch, int64_t heads, int64_t tokens, int64_t padded_tokens, int head_dim) const;
};

// Fills sizes and offsets from the layout; throws std::invalid_argument for misaligned tensors or a shape that
// does not fit the kernels' 32-bit token and head counts.
SagePrologueParams makePrologueParams(const AttentionVariant &variant, const schedules::ProblemShape &shape,
                                      const schedules::WorkspaceLayout &layout, const PrologueTensor &q,
                                      const PrologueTensor &k, const PrologueTensor &v, unsigned char *workspace);

} // namespace sage::codegen
