"""Which head dim sageattn runs a call at: the caller's, or the caller's zero-padded to one with a kernel or a faster
one. Zero-padding Q, K and V along the head dim is exact: the zero channels add nothing to Q.K^T or to O, and the
quantizers' statistics of the real channels do not change (per-block maxima, K's channel means; a zero channel gets
a zero mean and code 0). The caller's softmax scale (1/sqrt(d) of the real d by default) is folded into Q, and O's
padded channels are cut off. No torch needed here: the rule is plain arithmetic, tested without a GPU."""

# The library's own head dims: the mma.sync schedule's 32..256 in steps of 16 (schedules/PrologueHeadDim.cpp); the
# wgmma schedule (sm_90a) has tiles for 64 and 128 only.
LIBRARY_HEAD_DIMS = range(32, 257, 16)
SM90_HEAD_DIMS = (64, 128)
# The presets whose sm_90a padded calls were measured (H200, 2026-11-29, run 34, 16k tokens x hidden 2048 per call,
# f16, end to end against cuDNN; bench/results/head_dims_padding_probe_h200_2026-11-29_run34.json): d 48 / 80 / 96 /
# 112 padded ran 0.77-0.83x at 4k keys and 1.02-1.24x at 16k, where the mma.sync kernels at the real d ran
# 0.37-0.60x and 0.41-0.68x; at 1k keys the padded call was slower for sage-b (the padding's copies: 0.39-0.49x
# against 0.48-0.56x); d 32 sage-b ran 0.95-0.97x unpadded and 0.82-0.99x padded.
SM90_PADDED_PRESETS = ("sage-b", "sage2-fp8")
SM90_PAD_FROM_KV_TOKENS = 4096
SM90_KEEP = {("sage-b", 32)}


def kernel_head_dim(head_dim, tokens_kv, preset, capability, block_mask=False, forced_schedule=False):
    """The head dim to run a call of `head_dim` at. capability: the device's (major, minor); block_mask: the call
    passes one (its granularity is the schedule's: never padded); forced_schedule: SAGEGEN_SCHEDULE names one.
    Head dims that are not a multiple of 8 (16-byte rows) or exceed 256 are left to the library to refuse."""
    if block_mask or head_dim % 8 or not 8 <= head_dim <= LIBRARY_HEAD_DIMS[-1]:
        return head_dim
    native = head_dim in LIBRARY_HEAD_DIMS
    if (capability == (9, 0) and not forced_schedule and preset in SM90_PADDED_PRESETS
            and head_dim < SM90_HEAD_DIMS[-1] and head_dim not in SM90_HEAD_DIMS):
        padded = SM90_HEAD_DIMS[0] if head_dim < SM90_HEAD_DIMS[0] else SM90_HEAD_DIMS[1]
        if not native or (tokens_kv >= SM90_PAD_FROM_KV_TOKENS and (preset, head_dim) not in SM90_KEEP):
            return padded
        return head_dim
    if native:
        return head_dim
    return next(dim for dim in LIBRARY_HEAD_DIMS if dim >= head_dim)
