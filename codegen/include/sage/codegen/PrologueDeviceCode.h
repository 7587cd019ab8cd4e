// The text of a generated prologue kernel, section by section (internal to the prologue generator).
//
// A kernel source is, in this order: a header comment, KernelAbi.h, the generation-time constants, the basic
// helpers (geometry, f32 scale arithmetic, conversions, loads), the code packers, the psi_Q / psi_K structs,
// the shared-memory budgets, the tile library, the statistics scratch, the role functions its launch needs,
// and the __global__ entry that finds its role from blockIdx.x.
#pragma once

#include "sage/codegen/PrologueConfig.h"

#include <string>
#include <vector>

namespace sage::codegen::prologue {

// ---- PrologueDeviceLibrary.cpp ----
// The device library's header `name` (e.g. "sage/device/prologue/codes.cuh") with its includes, pasted: a prologue
// kernel is one self-contained translation unit (NVRTC receives no headers for it).
std::string pasteDeviceHeader(const std::string &name);
// constexpr shapes and tunables.
std::string emitConstants(const PrologueConfig &config);
// Shared-memory bytes of each role (after the quantizer structs); `roles` picks this launch's kSharedBytes.
std::string emitSharedBudgets(const std::vector<PrologueRole> &roles);
// sage/device/prologue/geometry.cuh (mirrored by prologueRoleCtas), scalar_helpers.cuh (f32 scale arithmetic),
// input_f16.cuh or input_bf16.cuh, global_memory.cuh, sequences.cuh (a slot's rows, dense or packed); and the
// using-directive that names them for the generated code.
std::string emitBasicHelpers(const PrologueConfig &config);
// codes.cuh (int8, int4), and fp4/microscaling.cuh and e4m3_codes.cuh when the variant has FP4 or e4m3 codes.
std::string emitCodeHelpers(const PrologueConfig &config);
// token_tile.cuh, tile_reductions.cuh, tile_quantizer.cuh: token tiles in registers, row/CTA/column reductions, the
// generic tile quantizer.
std::string emitTileLibrary();
// struct QQuantizer / KQuantizer: tile, groups, qmax, group of a row, code packing.
// `blocks_per_tile` attention tiles (b_q or b_kv tokens) make one CTA's tile.
std::string emitTokenQuantizer(const char *name, const TokenQuantizerConfig &quantizer, const char *tile_constant,
                               int blocks_per_tile, const char *what);
// Where launch 1 leaves the per-slice column statistics (inside k_codes) and how launch 2 finds them; with
// `with_reduction` also the column reduction that launch 1 runs.
std::string emitStatisticsScratch(const PrologueConfig &config, bool with_reduction);

// ---- PrologueRoleSources.cpp ----
// Device functions shared by several roles (QBlock, KBlock, combineVStatistics), as the roles need them.
std::string emitRoleSupport(const PrologueConfig &config, const std::vector<PrologueRole> &roles);
// `static __device__ void NAME(const SagePrologueParams &params, long long cta, unsigned char *shared)`.
std::string emitRoleFunction(PrologueRole role, const PrologueConfig &config);
std::string roleFunctionName(PrologueRole role, const PrologueConfig &config);
// Device expression of the role's CTA count in terms of `params.size` (mirrors prologueRoleCtas).
std::string roleCtaCountExpression(PrologueRole role);
// One line saying what the role does, for comments and PrologueKernel::grid_rule.
std::string roleSummary(PrologueRole role, const PrologueConfig &config);

} // namespace sage::codegen::prologue
