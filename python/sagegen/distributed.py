"""Context parallelism (issue 30): attention over a sequence sharded across the ranks of a torch.distributed group.

    import torch.distributed as dist, sagegen.distributed as sd
    sd.disable_nvlink_multicast()                       # before init_process_group: NCCL_NVLS_ENABLE=0, ...
    dist.init_process_group("nccl")
    q_local = sd.zigzag_shard(q, dist.get_rank(), dist.get_world_size(), dim=2)    # same for k, v
    o_local = sd.ring_attention(q_local, k_local, v_local, is_causal=True, preset="sage-b")
    o = sd.zigzag_unshard(all_gathered_shards, dim=2)   # or sd.gather_sequence(o_local, zigzag=True, dim=2)

Two forms, both on torch.distributed only (NCCL on GPUs, gloo works for CPU tests; no transport of our own):

- `ring_attention`: every rank keeps its Q shard; the K/V shards travel around the ring (batched isend/irecv to
  rank + 1, from rank - 1) while the current block is computed, and the partial outputs are merged by their LSE
  (sagegen._lse). Causal attention wants the zig-zag sharding: the sequence is cut into 2W chunks and rank r holds
  chunks r and 2W-1-r, so that every step does the same work on every rank (see `ring_block`). Backward: the
  standard ring backward, each block recomputed by SageBwd from the global O and LSE, dK/dV accumulators (f32)
  travelling with the K/V blocks and arriving home after W steps.
- `ulysses_attention`: two all-to-alls re-shard [heads, N/W] into [heads/W, N] and back; the local attention sees
  the whole sequence for its heads. Needs the heads to split over the ranks; uses the contiguous sharding
  (`shard_sequence`), not the zig-zag one. Differentiable through the local attention's own autograd (SageBwd).

Sequence lengths: nothing pads. `zigzag_shard` needs N divisible by 2W, `shard_sequence` by W, and refuse other
lengths with SageArgumentError naming the tensor; ring attention with is_causal needs an even local length. Every
rank must pass shards of the same shape (the library cannot see another rank's shape; a mismatch fails in NCCL).

The attention of one block is an injectable function, so the algorithm is testable exactly on CPU:
`attention_fn(q, k, v, causal, scale, layout) -> (o, lse)` (causal bottom-right aligned, lse natural-log f32
[b, h, n]) and, for the ring backward, `attention_backward_fn(q, k, v, o, lse, d_o, causal, scale, layout) -> (dq,
dk, dv)` with o and lse the *global* ones. Defaults: sagegen's kernels (`sage_block_forward(preset)`,
`sage_block_backward(backward_preset)`); `exact_block_forward` / `exact_block_backward` are plain-torch references.

Rotation (issue 25): the backward preset pairs with the forward one as in sagegen.sagebwd_attention (the same helper,
sagegen._backward.paired_presets): a rotated forward preset (`sage-b-rot`, `sage2-fp8-rot`) gets `sagebwd-rot-qks`,
others `sagebwd`. `rotate=True` picks the forward preset's `-rot` form (and so `sagebwd-rot-qks`), `rotate=False`
refuses a rotated preset, `rotate=None` (default) follows the preset's name.
"""

import math
import os

from ._backward import paired_presets
from ._library import BOTTOM_RIGHT, SageArgumentError
from ._lse import merge_attention, merge_attention_into, merge_pair

try:
    import torch
    import torch.distributed as dist
except ImportError:  # sagegen imports without torch; everything here needs it
    torch = dist = None

__all__ = ["ring_attention", "ulysses_attention", "merge_attention", "merge_attention_into", "ring_block",
           "zigzag_shard", "zigzag_unshard", "zigzag_positions", "shard_sequence", "gather_sequence",
           "sage_block_forward", "sage_block_backward", "exact_block_forward", "exact_block_backward",
           "disable_nvlink_multicast", "NVLINK_MULTICAST_OFF"]

# The H200 hosts run with NVLink SHARP / multicast off; the scripts keep it that way (issue 30).
NVLINK_MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


def disable_nvlink_multicast():
    """Sets NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 in this process's environment (read by NCCL
    when its communicators are created: call before torch.distributed.init_process_group). Returns the values."""
    os.environ.update(NVLINK_MULTICAST_OFF)
    return dict(NVLINK_MULTICAST_OFF)


def _need_torch(what):
    if torch is None:
        raise ImportError(f"sagegen.distributed.{what} needs PyTorch")


def _check_layout(layout, name="tensor_layout"):
    if layout not in ("HND", "NHD"):
        raise SageArgumentError(f"{name}: expected 'HND' or 'NHD', got {layout!r}")


def _seq_dim(layout):
    return 2 if layout == "HND" else 1


def _head_dim(layout):
    return 1 if layout == "HND" else 2


# ---- sharding ---------------------------------------------------------------------------------------------------

def _check_divisible(x, dim, parts, name, what):
    if not isinstance(x, torch.Tensor):
        raise SageArgumentError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if not -x.dim() <= dim < x.dim():
        raise SageArgumentError(f"dim: {dim} is not a dimension of {name} (shape {tuple(x.shape)})")
    tokens = x.shape[dim]
    if tokens % parts != 0:
        raise SageArgumentError(f"{name}: {tokens} tokens (dimension {dim}) do not split into {what} = {parts} equal "
                                f"chunks; nothing is padded: pad the sequence to a multiple of {parts} (and mask "
                                f"the padding) before sharding")
    return tokens // parts


def _check_rank(rank, world_size):
    if not isinstance(world_size, int) or world_size < 1:
        raise SageArgumentError(f"world_size: expected a positive int, got {world_size!r}")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise SageArgumentError(f"rank: expected an int in [0, {world_size}), got {rank!r}")


def zigzag_positions(rank, world_size, tokens):
    """The global token positions rank `rank` holds under the zig-zag sharding of `tokens` tokens, in local order
    (chunk rank, then chunk 2W-1-rank): a list of ints."""
    _check_rank(rank, world_size)
    if tokens % (2 * world_size) != 0:
        raise SageArgumentError(f"tokens: {tokens} is not a multiple of 2 * world_size = {2 * world_size}")
    chunk = tokens // (2 * world_size)
    first, second = rank, 2 * world_size - 1 - rank
    return list(range(first * chunk, (first + 1) * chunk)) + list(range(second * chunk, (second + 1) * chunk))


def zigzag_shard(x, rank, world_size, dim=2):
    """Rank `rank`'s zig-zag shard of the full sequence x along `dim` (2 for HND, 1 for NHD): chunks rank and
    2W-1-rank of 2W equal chunks, concatenated (a new contiguous tensor). N must be divisible by 2W."""
    _need_torch("zigzag_shard")
    _check_rank(rank, world_size)
    chunk = _check_divisible(x, dim, 2 * world_size, "x", "2 * world_size")
    first = x.narrow(dim, rank * chunk, chunk)
    second = x.narrow(dim, (2 * world_size - 1 - rank) * chunk, chunk)
    return torch.cat([first, second], dim=dim)


def zigzag_unshard(shards, dim=2):
    """The full sequence from every rank's zig-zag shard (shards[r] from rank r), inverse of zigzag_shard."""
    _need_torch("zigzag_unshard")
    shards = list(shards)
    world_size = len(shards)
    if world_size == 0:
        raise SageArgumentError("shards: expected one shard per rank, got none")
    halves = [_check_divisible(shard, dim, 2, f"shards[{index}]", "2 (the zig-zag's two chunks per rank)")
              for index, shard in enumerate(shards)]
    chunks = [None] * (2 * world_size)
    for rank, (shard, half) in enumerate(zip(shards, halves)):
        chunks[rank] = shard.narrow(dim, 0, half)
        chunks[2 * world_size - 1 - rank] = shard.narrow(dim, half, half)
    return torch.cat(chunks, dim=dim)


def shard_sequence(x, rank, world_size, dim=2):
    """Rank `rank`'s contiguous shard (chunk rank of W equal chunks) of x along `dim`: Ulysses' sharding, and ring
    attention's without is_causal. N must be divisible by W. A new contiguous tensor."""
    _need_torch("shard_sequence")
    _check_rank(rank, world_size)
    chunk = _check_divisible(x, dim, world_size, "x", "world_size")
    return x.narrow(dim, rank * chunk, chunk).contiguous()


def gather_sequence(x, group=None, dim=2, zigzag=False):
    """All-gathers every rank's shard of a sequence along `dim` (a collective: every rank calls it) and returns the
    full sequence, undoing the zig-zag order when zigzag=True."""
    _need_torch("gather_sequence")
    group, world_size, _ = _group_info(group)
    x = x.contiguous()
    shards = [torch.empty_like(x) for _ in range(world_size)]
    dist.all_gather(shards, x, group=group)
    return zigzag_unshard(shards, dim=dim) if zigzag else torch.cat(shards, dim=dim)


# ---- the ring's block plan ----------------------------------------------------------------------------------------

def ring_block(rank, source, world_size, is_causal, tokens):
    """What rank `rank` computes with the K/V shard of rank `source` (it arrives at step (rank - source) mod W):
    (rows, cols, causal) with rows, cols slices of the local Q and K/V shards and causal whether the block is
    masked on its diagonal (bottom-right = top-left: the block is square then). Never empty.

    Without is_causal every block is whole. With it (zig-zag shards of `tokens` local tokens, two chunks each):
    the own shard is a causal block; a shard from a lower rank is seen by every local query through its first chunk
    only (its second chunk lies after both local chunks); a shard from a higher rank is seen whole, by the second
    local chunk only. Each step is (2c x 2c) / 2 of work on every rank."""
    _check_rank(rank, world_size)
    _check_rank(source, world_size)
    whole = slice(0, tokens)
    if not is_causal:
        return whole, whole, False
    if tokens % 2 != 0:
        raise SageArgumentError(f"q: causal ring attention needs an even number of local tokens (the zig-zag "
                                f"shard's two chunks), got {tokens}")
    half = tokens // 2
    if source == rank:
        return whole, whole, True
    if source < rank:
        return whole, slice(0, half), False
    return slice(half, tokens), whole, False


# ---- block attention: sagegen's kernels and an exact reference ----------------------------------------------------

_forward_fns = {}


def sage_block_forward(preset="sage-b", tunables=None):
    """The block function ring attention uses by default: sagegen.sageattn with the given forward preset, causal
    bottom-right aligned, returning (o, lse)."""
    key = (preset, tunables or "")
    if key not in _forward_fns:
        def forward(q, k, v, causal, scale, layout):
            from ._torch import sageattn
            return sageattn(q, k, v, tensor_layout=layout, is_causal=causal, sm_scale=scale, return_lse=True,
                            preset=preset, tunables=tunables, causal_alignment=BOTTOM_RIGHT)
        forward.__qualname__ = f"sage_block_forward({preset!r})"
        _forward_fns[key] = forward
    return _forward_fns[key]


def sage_block_backward(preset="sagebwd"):
    """The ring backward's default block function: SageBwd's kernels (backward preset "sagebwd", or "sagebwd-rot-qks"
    after a rotated forward: ring_attention picks it with paired_presets) from the given O and LSE, which the ring
    passes global, so each block's dQ, dK, dV are its exact share of the full gradient. The function's `preset`
    attribute names its backward preset."""
    if not isinstance(preset, str) or not preset:
        raise SageArgumentError(f"preset: expected a backward preset name, got {preset!r}")

    def backward(q, k, v, o, lse, d_o, causal, scale, layout):
        from . import _backward  # looked up per call (the module's function, so a test can stand in for it)
        if layout == "NHD":  # the backward kernels take HND
            q, k, v, o, d_o = (t.transpose(1, 2) for t in (q, k, v, o, d_o))
        d_q, d_k, d_v = _backward._backward_body(q, k, v, o, lse, d_o, causal, scale, preset)
        if layout == "NHD":
            d_q, d_k, d_v = (t.transpose(1, 2) for t in (d_q, d_k, d_v))
        return d_q, d_k, d_v
    backward.preset = preset
    backward.__qualname__ = f"sage_block_backward({preset!r})"
    return backward


def _named_rotation(block_fn, preset, rotated):
    """block_fn, whose kernel is the preset `rotated` that rotate=True made of `preset`: a refusal of that name
    (no such rotated preset: the library's error, on the first call, the same on every rank) names rotate."""
    def fn(*args):
        try:
            return block_fn(*args)
        except SageArgumentError as error:
            if f"'{rotated}'" not in str(error):
                raise
            raise SageArgumentError(f"rotate: True, but preset {preset!r} has no rotated form ({error})") from error
    fn.__qualname__ = getattr(block_fn, "__qualname__", "block_fn")
    return fn


def _ring_block_functions(preset, rotate, tunables, attention_fn, attention_backward_fn):
    """(forward block function, backward block function) of ring_attention: the given ones, or sagegen's kernels
    for `preset` and its paired backward preset (paired_presets, as sagebwd_attention: `-rot` -> `sagebwd-rot-qks`)."""
    forward_preset, backward_preset = _paired(preset, rotate, attention_fn is not None and
                                              attention_backward_fn is not None)
    forward_fn = attention_fn
    if forward_fn is None:
        forward_fn = sage_block_forward(forward_preset, tunables)
        if forward_preset != preset:
            forward_fn = _named_rotation(forward_fn, preset, forward_preset)
    backward_fn = attention_backward_fn
    if backward_fn is None:
        backward_fn = sage_block_backward(backward_preset)
    return forward_fn, backward_fn


def _paired(preset, rotate, replaced):
    """paired_presets(preset, rotate), refusing arguments by ring_attention's and ulysses_attention's names:
    rotate=True where the block functions given replace every kernel it would rotate."""
    if not isinstance(preset, str) or not preset:
        raise SageArgumentError(f"preset: expected a preset name, got {preset!r}")
    if rotate is True and replaced:
        raise SageArgumentError("rotate: True, but the block functions given replace sagegen's kernels (rotate "
                                "picks sagegen's rotated presets): rotate inside them, or pass rotate=None")
    return paired_presets(preset, rotate)


def _to_hnd(t, layout):
    return t if layout == "HND" else t.transpose(1, 2)


def _exact_logits(q, k, causal, scale):
    """f32 (f64 for f64 inputs) logits [b, h_q, n_q, n_kv], K's heads repeated for GQA, masked bottom-right."""
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k = q.to(compute), k.to(compute)
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1) if group > 1 else k
    logits = torch.matmul(q, k.transpose(-1, -2)) * scale
    if causal:
        n_q, n_kv = q.shape[2], k.shape[2]
        rows = torch.arange(n_q, device=q.device).unsqueeze(1)
        cols = torch.arange(n_kv, device=q.device).unsqueeze(0)
        logits = logits.masked_fill(cols > rows + (n_kv - n_q), float("-inf"))
    return logits


def exact_block_forward(q, k, v, causal, scale, layout):
    """Exact attention in plain torch (f32, or f64 for f64 inputs), the reference block function: (o in q's dtype,
    lse f32 [b, h, n], -inf and o = 0 for a row that sees no key). Differentiable (autograd)."""
    q, k, v = (_to_hnd(t, layout) for t in (q, k, v))
    logits = _exact_logits(q, k, causal, scale)
    lse = torch.logsumexp(logits, dim=-1)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    p = torch.exp(logits - safe.unsqueeze(-1))
    group = q.shape[1] // v.shape[1]
    v = v.to(p.dtype)
    v = v.repeat_interleave(group, dim=1) if group > 1 else v
    o = torch.matmul(p, v).to(q.dtype)
    o = o if layout == "HND" else o.transpose(1, 2)
    return o, lse.float()


def exact_block_backward(q, k, v, o, lse, d_o, causal, scale, layout):
    """FlashAttention's backward of one block in plain torch, from the given (global) O and LSE: P = exp(S - LSE),
    dV = P^T dO, dS = P (dO V^T - rowsum(dO * O)), dQ = scale dS K, dK = scale dS^T Q (summed over a GQA group).
    The reference for the ring backward; returns tensors in the inputs' dtypes."""
    dtypes = (q.dtype, k.dtype, v.dtype)
    q, k, v, o, d_o = (_to_hnd(t, layout) for t in (q, k, v, o, d_o))
    logits = _exact_logits(q, k, causal, scale)
    compute = logits.dtype
    p = torch.exp(logits - lse.to(compute).unsqueeze(-1))             # 0 where masked or LSE = -inf
    group = q.shape[1] // k.shape[1]
    expand = (lambda t: t.repeat_interleave(group, dim=1)) if group > 1 else (lambda t: t)  # noqa: E731
    k_full, v_full = expand(k.to(compute)), expand(v.to(compute))
    d_o, o, q_c = d_o.to(compute), o.to(compute), q.to(compute)
    d_v = torch.matmul(p.transpose(-1, -2), d_o)
    d_p = torch.matmul(d_o, v_full.transpose(-1, -2))
    delta = (d_o * o).sum(dim=-1, keepdim=True)
    d_s = p * (d_p - delta)
    d_q = torch.matmul(d_s, k_full) * scale
    d_k = torch.matmul(d_s.transpose(-1, -2), q_c) * scale
    if group > 1:
        b, h, n, d = d_k.shape
        d_k = d_k.view(b, h // group, group, n, d).sum(dim=2)
        d_v = d_v.view(b, h // group, group, n, d).sum(dim=2)
    grads = [t if layout == "HND" else t.transpose(1, 2) for t in (d_q, d_k, d_v)]
    return tuple(g.to(dtype) for g, dtype in zip(grads, dtypes))


# ---- communication -----------------------------------------------------------------------------------------------

def _group_info(group):
    if dist is None or not dist.is_available() or not dist.is_initialized():
        raise SageArgumentError("group: torch.distributed is not initialized (call torch.distributed."
                                "init_process_group first)")
    if group is None:
        group = dist.group.WORLD
    return group, dist.get_world_size(group), dist.get_rank(group)


def _global_rank(group, group_rank):
    if group is None or group is dist.group.WORLD:
        return group_rank
    get = getattr(dist, "get_global_rank", None) or dist.distributed_c10d._get_global_rank
    return get(group, group_rank)


class _Transfer:
    """Tensors in flight to the next rank and from the previous one (one batched isend/irecv)."""

    def __init__(self, works, sent, received):
        self._works, self._sent, self.received = works, sent, received

    def wait(self):
        """The received tensors. On NCCL the current stream waits for the transfer (the host does not); the sent
        tensors are held until then, so their memory is not reused under the transfer."""
        for work in self._works:
            work.wait()
        self._works, self._sent = [], None
        return self.received


class _Ring:
    """Rank r sends to r + 1 and receives from r - 1 (ranks of the group, mod its size)."""

    def __init__(self, group, world_size, rank):
        self.group = group
        self.next = _global_rank(group, (rank + 1) % world_size)
        self.previous = _global_rank(group, (rank - 1) % world_size)

    def start(self, tensors):
        received = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, self.previous, self.group) for t in received]
        return _Transfer(dist.batch_isend_irecv(ops), tensors, received)


# ---- ring attention ----------------------------------------------------------------------------------------------

def _plan(rank, world_size, is_causal, tokens):
    """ring_block of each step: step s computes with the K/V shard of rank (rank - s) mod W."""
    return [ring_block(rank, (rank - step) % world_size, world_size, is_causal, tokens) for step in range(world_size)]


def _lse_rows(lse, rows):
    return lse[..., rows]


def _complement(rows, tokens):
    """The row slices of [0, tokens) outside `rows` (a slice of it), the empty ones left out."""
    return [part for part in (slice(0, rows.start or 0), slice(rows.stop, tokens)) if part.stop > part.start]


def _ring_forward(q, k, v, group, is_causal, scale, layout, attention_fn):
    """(o in q's dtype, lse f32) of the local queries against every rank's K/V.

    The merges (sagegen._lse.merge_pair: one fused kernel each on CUDA) read step 0's O in its own dtype: step 1
    merges it with its own O into a fresh f32 accumulator, later steps merge into that in place, and the last step
    writes its merge straight into the output in q's dtype. Rows a step does not see (the causal ring's halves) are
    copied over where the merge changes tensors."""
    group, world_size, rank = _group_info(group)
    seq = _seq_dim(layout)
    tokens = q.shape[seq]
    at = lambda t, part: t[(slice(None),) * seq + (part,)]  # noqa: E731
    plan = _plan(rank, world_size, is_causal, tokens)  # refusals before any communication
    ring = _Ring(group, world_size, rank)
    acc_o = acc_lse = None
    k_now, v_now = k, v
    for step, (rows, cols, causal) in enumerate(plan):
        transfer = ring.start([k_now, v_now]) if step + 1 < world_size else None
        o, lse = attention_fn(at(q, rows), at(k_now, cols), at(v_now, cols), causal, scale, layout)
        if step == 0:  # the own shard, every row: kept as it is until step 1 merges into it
            acc_o = o
            acc_lse = lse.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
        else:
            last = step == world_size - 1
            target = acc_o
            if last or step == 1:  # a new tensor: the output, or the f32 accumulator
                target = torch.empty(q.shape, dtype=q.dtype if last else torch.float32, device=q.device)
                for part in _complement(rows, tokens):
                    at(target, part).copy_(at(acc_o, part))
            lse_rows = _lse_rows(acc_lse, rows)
            merge_pair(at(acc_o, rows), lse_rows, o, lse, at(target, rows), lse_rows, layout)
            acc_o = target
        if transfer is not None:
            k_now, v_now = transfer.wait()
    return acc_o.to(q.dtype), acc_lse  # W > 1: q's dtype already (no copy); W = 1: the block's O


def _ring_backward(q, k, v, o, lse, d_o, group, is_causal, scale, layout, backward_fn):
    """(dq, dk, dv) of the local shards: dq accumulates here, dK/dV accumulators (f32) travel with the K/V blocks
    and come home after the last step."""
    group, world_size, rank = _group_info(group)
    seq = _seq_dim(layout)
    tokens = q.shape[seq]
    at = lambda t, part: t[(slice(None),) * seq + (part,)]  # noqa: E731
    plan = _plan(rank, world_size, is_causal, tokens)
    ring = _Ring(group, world_size, rank)
    d_q = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    k_now, v_now = k, v
    d_kv = None  # (dK, dV) accumulators of the block held now, or the transfer bringing them
    for step, (rows, cols, causal) in enumerate(plan):
        kv_transfer = ring.start([k_now, v_now]) if step + 1 < world_size else None
        block_dq, block_dk, block_dv = backward_fn(at(q, rows), at(k_now, cols), at(v_now, cols), at(o, rows),
                                                   _lse_rows(lse, rows), at(d_o, rows), causal, scale, layout)
        at(d_q, rows).add_(block_dq)
        if d_kv is None:  # step 0: the own block, every column
            d_k_now = torch.empty(k.shape, dtype=torch.float32, device=k.device).copy_(block_dk)
            d_v_now = torch.empty(v.shape, dtype=torch.float32, device=v.device).copy_(block_dv)
        else:
            d_k_now, d_v_now = d_kv.wait()  # sent by rank - 1 after its previous step: overlapped with this one
            at(d_k_now, cols).add_(block_dk)
            at(d_v_now, cols).add_(block_dv)
        d_kv = ring.start([d_k_now, d_v_now])  # W transfers: after the last, each block's sum is at its owner
        if kv_transfer is not None:
            k_now, v_now = kv_transfer.wait()
    d_k, d_v = d_kv.wait()
    return d_q.to(q.dtype), d_k.to(k.dtype), d_v.to(v.dtype)


if torch is not None:
    class _RingAttention(torch.autograd.Function):
        """Ring attention with the ring backward (O, LSE saved; the LSE output has no gradient)."""

        @staticmethod
        def forward(ctx, q, k, v, group, is_causal, scale, layout, attention_fn, backward_fn):
            o, lse = _ring_forward(q, k, v, group, is_causal, scale, layout, attention_fn)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.options = (group, is_causal, scale, layout, backward_fn)
            ctx.mark_non_differentiable(lse)
            ctx.set_materialize_grads(False)
            return o, lse

        @staticmethod
        def backward(ctx, d_o, d_lse):
            if d_o is None:
                return (None,) * 9
            q, k, v, o, lse = ctx.saved_tensors
            group, is_causal, scale, layout, backward_fn = ctx.options
            d_q, d_k, d_v = _ring_backward(q, k, v, o, lse, d_o.contiguous(), group, is_causal, scale, layout,
                                           backward_fn)
            return (d_q, d_k, d_v) + (None,) * 6


def _check_qkv(q, k, v, layout):
    _check_layout(layout)
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not isinstance(tensor, torch.Tensor):
            raise SageArgumentError(f"{name}: expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dim() != 4:
            dims = "[b, h, n, d]" if layout == "HND" else "[b, n, h, d]"
            raise SageArgumentError(f"{name}: expected a 4-D tensor ({dims} for tensor_layout {layout!r}), got shape "
                                    f"{tuple(tensor.shape)}")
        if tensor.device != q.device or tensor.dtype != q.dtype:
            raise SageArgumentError(f"{name}: expected q's device and dtype ({q.device}, {q.dtype}), got "
                                    f"{tensor.device}, {tensor.dtype}")
    if k.shape != v.shape:
        raise SageArgumentError(f"v: expected k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    seq, heads = _seq_dim(layout), _head_dim(layout)
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise SageArgumentError(f"k: batch and head_dim must match q's ({tuple(q.shape)}), got {tuple(k.shape)}")
    if q.shape[heads] % k.shape[heads] != 0:
        raise SageArgumentError(f"k: {k.shape[heads]} heads do not divide q's {q.shape[heads]}")
    return seq, heads


def _scale(sm_scale, head_dim):
    if sm_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if not isinstance(sm_scale, (int, float)) or not math.isfinite(sm_scale) or sm_scale <= 0:
        raise SageArgumentError(f"sm_scale: expected a positive finite number, got {sm_scale!r}")
    return float(sm_scale)


def _wants_grad(*tensors):
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def ring_attention(q, k, v, group=None, is_causal=False, sm_scale=None, tensor_layout="HND", preset="sage-b",
                   return_lse=False, tunables=None, attention_fn=None, attention_backward_fn=None, rotate=None):
    """Attention of this rank's queries over the whole sharded sequence, K/V passed around the ring.

    q, k, v: this rank's shards, [b, h, n_local, d] ("HND") or [b, n_local, h, d] ("NHD"), k/v with h_kv heads
    dividing h. With is_causal the shards must be the zig-zag ones (`zigzag_shard`; n_local even) and q and k hold
    the same tokens; without it any sharding works (a rank's output rows are its query rows). Every rank of
    `group` (default: the world) calls it with the same shapes. sm_scale: default 1/sqrt(d). preset / tunables: the
    forward kernel (sagegen.sageattn's). Returns o (q's dtype, this rank's rows), or (o, lse) with lse f32
    [b, h, n_local], the natural-log LSE over the whole sequence.

    Autograd: with inputs requiring gradients the ring backward runs (SageBwd's kernels by default, with the
    global O and LSE: exact per block, each block quantized on its own); the LSE output has no gradient. Its
    backward preset pairs with `preset` as sagebwd_attention's does: `sagebwd-rot-qks` after a rotated (`-rot`)
    forward preset, `sagebwd` otherwise. rotate: None (the preset's name decides), True (Q and K rotated in both
    passes: the preset's `-rot` form and `sagebwd-rot-qks`) or False (refuses a `-rot` preset).
    attention_fn / attention_backward_fn replace the block kernels (module docstring)."""
    _need_torch("ring_attention")
    seq, _ = _check_qkv(q, k, v, tensor_layout)
    if is_causal and q.shape[seq] != k.shape[seq]:
        raise SageArgumentError(f"k: causal ring attention needs q's and k's shards to hold the same tokens "
                                f"({q.shape[seq]} local queries, {k.shape[seq]} local keys)")
    if is_causal and q.shape[seq] % 2 != 0:
        raise SageArgumentError(f"q: causal ring attention needs an even number of local tokens (the zig-zag "
                                f"shard's two chunks), got {q.shape[seq]}")
    scale = _scale(sm_scale, q.shape[3])
    forward_fn, backward_fn = _ring_block_functions(preset, rotate, tunables, attention_fn, attention_backward_fn)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if _wants_grad(q, k, v):
        o, lse = _RingAttention.apply(q, k, v, group, bool(is_causal), scale, tensor_layout, forward_fn,
                                      backward_fn)
    else:
        with torch.no_grad():
            o, lse = _ring_forward(q, k, v, group, bool(is_causal), scale, tensor_layout, forward_fn)
    return (o, lse) if return_lse else o


# ---- Ulysses (all-to-all over heads) -----------------------------------------------------------------------------

def _all_to_all(x, group, world_size, scatter_dim, gather_dim):
    """Chunk i of x along scatter_dim goes to rank i; the chunks received are concatenated along gather_dim in rank
    order."""
    if world_size == 1:
        return x
    send = torch.stack(x.chunk(world_size, dim=scatter_dim)).contiguous()   # [W, ...]: chunk i for rank i
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return torch.cat(received.unbind(0), dim=gather_dim)


if torch is not None:
    class _AllToAll(torch.autograd.Function):
        """x re-sharded from gather_dim-sharded to scatter_dim-sharded; its adjoint (the backward) is the reverse."""

        @staticmethod
        def forward(ctx, x, group, world_size, scatter_dim, gather_dim):
            ctx.options = (group, world_size, scatter_dim, gather_dim)
            return _all_to_all(x, group, world_size, scatter_dim, gather_dim)

        @staticmethod
        def backward(ctx, grad):
            group, world_size, scatter_dim, gather_dim = ctx.options
            return _all_to_all(grad.contiguous(), group, world_size, gather_dim, scatter_dim), None, None, None, None


def _sage_local_attention(preset, tunables, need_lse):
    """Ulysses' default local attention: sageattn without gradients (its LSE only when asked for: the kernel
    without it is a little faster), sagebwd_attention (SageBwd) with them, whose backward preset pairs with
    `preset` (paired_presets: `sagebwd-rot-qks` after a `-rot` preset)."""
    forward_only = sage_block_forward(preset, tunables)

    def attention(q, k, v, causal, scale, layout):
        if not _wants_grad(q, k, v):
            if not need_lse:
                from ._torch import sageattn
                return sageattn(q, k, v, tensor_layout=layout, is_causal=causal, sm_scale=scale, preset=preset,
                                tunables=tunables, causal_alignment=BOTTOM_RIGHT), None
            return forward_only(q, k, v, causal, scale, layout)
        from . import _backward  # looked up per call (the module's function, so a test can stand in for it)
        q, k, v = (_to_hnd(t, layout) for t in (q, k, v))
        o, lse = _backward.sagebwd_attention(q, k, v, is_causal=causal, scale=scale, forward_preset=preset,
                                             return_lse=True)
        return (o if layout == "HND" else o.transpose(1, 2)), lse
    return attention


def ulysses_attention(q, k, v, group=None, is_causal=False, sm_scale=None, tensor_layout="HND", preset="sage-b",
                      return_lse=False, tunables=None, attention_fn=None, rotate=None):
    """Attention over the whole sharded sequence by all-to-all over heads (DeepSpeed-Ulysses / USP).

    q, k, v: this rank's contiguous shards (`shard_sequence`: rank r holds tokens [r N/W, (r+1) N/W)), layouts as
    ring_attention. q's heads must split over the W ranks (SageArgumentError otherwise); k/v's too, or else they are
    repeated up to q's heads first (GQA with fewer KV heads than ranks). Returns o (this rank's rows), or (o, lse).
    Differentiable: the all-to-alls are their own adjoints and the local attention is sagegen.sagebwd_attention
    (SageBwd) when gradients are wanted; attention_fn(q, k, v, causal, scale, layout) -> (o, lse) replaces it (it
    must be differentiable itself to train). rotate: as ring_attention's (True: the preset's `-rot` form, whose
    SageBwd backward is `sagebwd-rot-qks`)."""
    _need_torch("ulysses_attention")
    seq, heads = _check_qkv(q, k, v, tensor_layout)
    forward_preset, _ = _paired(preset, rotate, attention_fn is not None)
    group, world_size, _ = _group_info(group)
    if q.shape[heads] % world_size != 0:
        raise SageArgumentError(f"q: {q.shape[heads]} heads do not split over {world_size} ranks (Ulysses shards "
                                f"the heads; use ring_attention)")
    if k.shape[heads] % world_size != 0:
        group_size = q.shape[heads] // k.shape[heads]
        k, v = (t.repeat_interleave(group_size, dim=heads) for t in (k, v))
    scale = _scale(sm_scale, q.shape[3])
    fn = attention_fn
    if fn is None:
        fn = _sage_local_attention(forward_preset, tunables, bool(return_lse))
        if forward_preset != preset:
            fn = _named_rotation(fn, preset, forward_preset)
    to_heads = lambda t: _AllToAll.apply(t, group, world_size, heads, seq)  # noqa: E731
    q_h, k_h, v_h = to_heads(q), to_heads(k), to_heads(v)
    o_h, lse_h = fn(q_h.contiguous(), k_h.contiguous(), v_h.contiguous(), bool(is_causal), scale, tensor_layout)
    o = _AllToAll.apply(o_h, group, world_size, seq, heads)
    if not return_lse:
        return o
    with torch.no_grad():  # lse [b, h/W, N] -> [b, h, N/W]: heads are dim 1, tokens dim 2
        lse = _all_to_all(lse_h.float().contiguous(), group, world_size, 2, 1)
    return o, lse
