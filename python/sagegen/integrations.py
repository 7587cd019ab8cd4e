"""Front doors for what users run (issue 28 item 3): each runs sagegen where it can and PyTorch's SDPA where it
cannot, warning once per reason why.

    sagegen.integrations.sageattn(q, k, v, tensor_layout="NHD", is_causal=False, sm_scale=None, return_lse=False)
        SageAttention's `sageattn` as ComfyUI, diffusers' sage backends and SGLang's diffusion backend call it.
    sagegen.integrations.install_sageattention()
        makes `import sageattention` give that function (for code that imports SageAttention by name).
    sagegen.integrations.register_transformers(name="sagegen")
        transformers' official hook: AttentionInterface.register, then attn_implementation="sagegen". Packed
        (padding-free) batches run on sagegen.sageattn_varlen, each sequence attended alone.
    sagegen.integrations.patch_diffusers()
        points diffusers' "sage" attention backend at sagegen (a monkey-patch of diffusers' module globals).

Fallback reasons: CPU (non-CUDA) tensors, dtypes other than float16/bfloat16 or mixed ones, inputs requiring grad,
attention masks, dropout, and whatever the library refuses as unsupported (a head dim without a kernel, an option
no preset computes: SageUnsupportedError). A caller's mistake (SageArgumentError) is raised, never hidden.
transformers and diffusers stay optional: nothing here imports them until asked to.
"""

import sys
import threading
import types
import weakref

from ._library import SageUnsupportedError
from ._torch import fallback_reason, say_once, torch, torch_attention
from ._torch import sageattn as _strict_sageattn
from ._varlen import sageattn_varlen as _sageattn_varlen
from ._varlen import torch_varlen_attention

__all__ = ["sageattn", "install_sageattention", "transformers_attention", "register_transformers",
           "patch_diffusers"]

_SAGEATTN_DOOR = "sagegen.integrations.sageattn"
_TRANSFORMERS_DOOR = "sagegen (transformers attention)"


def sageattn(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, return_lse=False, **kwargs):
    """sagegen.sageattn, falling back to PyTorch (once per reason, with a warning) where sagegen cannot run:
    attn_mask / dropout_p given, CPU tensors, float32 or mixed dtypes, inputs requiring grad, or a
    SageUnsupportedError (head dims without a kernel, smooth_k=False, smooth_v=True, another qk_quant_gran or
    pv_accum_dtype than the preset's). Returns o or (o, lse) as sagegen.sageattn does."""
    if torch is None:
        raise ImportError("sagegen.integrations.sageattn needs PyTorch")
    attn_mask, dropout_p = kwargs.get("attn_mask"), kwargs.get("dropout_p", 0.0)
    reason = fallback_reason(q, k, v, attn_mask, dropout_p if isinstance(dropout_p, (int, float)) else 0.0)
    if reason is None:
        try:
            return _strict_sageattn(q, k, v, tensor_layout, is_causal, sm_scale, return_lse, **kwargs)
        except SageUnsupportedError as error:
            reason = str(error)
    if kwargs.get("block_mask") is not None:  # PyTorch's SDPA would attend to the blocks the mask skips
        raise SageUnsupportedError(f"block_mask: no PyTorch fallback computes block-sparse attention ({reason})")
    say_once(_SAGEATTN_DOOR, reason)
    return torch_attention(q, k, v, tensor_layout, bool(is_causal), sm_scale, bool(return_lse), attn_mask,
                           float(dropout_p or 0.0), kwargs.get("causal_alignment", "top-left") == "bottom-right")


def install_sageattention(force=False):
    """Registers a module named `sageattention` whose `sageattn` is the function above, so that code doing
    `from sageattention import sageattn` (ComfyUI's --use-sage-attention, SGLang diffusion's sage_attn backend)
    runs sagegen; diffusers also reads the installed package's metadata, so use patch_diffusers() there. Call it before that code imports sageattention. A real SageAttention already imported
    is left alone unless force=True. Returns the module."""
    existing = sys.modules.get("sageattention")
    if existing is not None and not force and not getattr(existing, "__sagegen_shim__", False):
        return existing
    module = types.ModuleType("sageattention", "sagegen standing in for SageAttention's sageattn")
    module.sageattn = sageattn
    module.__sagegen_shim__ = True
    module.__version__ = "2.2.0+sagegen"  # what version checks see (diffusers asks for >= 2.1.1)
    sys.modules["sageattention"] = module
    return module


# ---- transformers ----

def _transformers_refusal(query, key, value, attention_mask, dropout, kwargs):
    """Why sagegen cannot run this transformers attention call (None: it may try)."""
    reason = fallback_reason(query, key, value, attention_mask, dropout)
    if reason is None:
        if kwargs.get("softcap") is not None:
            reason = "logit softcapping (softcap) is not supported"
        elif kwargs.get("head_mask") is not None:
            reason = "head_mask is not supported"
        elif kwargs.get("output_attentions"):
            reason = "output_attentions needs the attention weights, which sagegen does not form"
        elif key.shape[1] == 0 or query.shape[1] % key.shape[1] != 0:
            reason = f"{query.shape[1]} query heads are not a multiple of {key.shape[1]} key/value heads"
    return reason


def transformers_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """A transformers attention function: query [b, h_q, n_q, d], key/value [b, h_kv, n_kv, d]; returns
    (attn_output [b, n_q, h_q, d], None). Causal exactly as transformers' sdpa_attention_forward decides it
    (is_causal from kwargs or the module, only with several query tokens and no mask); GQA natively. Masks (padding,
    sliding windows the mask spells out), dropout, softcap, head_mask, output_attentions, CPU tensors, float32 and
    gradients go to transformers' own SDPA function, with one warning per reason.

    Packed (padding-free) batches, as transformers' flash-attention path recognizes them (packed_sequences), run on
    sagegen.sageattn_varlen: each sequence attended alone, causal per sequence."""
    packing = packed_sequences(query, key, attention_mask, kwargs)
    if packing is not None:
        return _packed_attention(module, query, key, value, attention_mask, scaling, dropout, packing, kwargs)
    is_causal = kwargs.pop("is_causal", None)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(query.shape[2] > 1 and attention_mask is None and causal)
    reason = _transformers_refusal(query, key, value, attention_mask, dropout, kwargs)
    if reason is None:
        try:
            out = _strict_sageattn(query, key, value, "HND", causal, scaling)
            return out.transpose(1, 2).contiguous(), None
        except SageUnsupportedError as error:
            reason = str(error)
    say_once(_TRANSFORMERS_DOOR, reason)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    if is_causal is not None:
        kwargs["is_causal"] = is_causal
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  **kwargs)


# ---- transformers: packed (padding-free) batches ----

class Packing:
    """A packed call's sequences over the flattened tokens (b * n of them): cu_seqlens (int32, on the device) and the
    host maxima; `derived`: computed here from position_ids (valid by construction, so not checked again)."""

    def __init__(self, cu_q, cu_k, max_q, max_k, derived, offsets=None):
        self.cu_q, self.cu_k, self.max_q, self.max_k, self.derived = cu_q, cu_k, max_q, max_k, derived
        self._offsets = offsets

    def offsets(self):
        """(cu_q, cu_k) as host lists (one device-to-host copy, where not derived here)."""
        if self._offsets is None:
            self._offsets = (self.cu_q.tolist(), self.cu_k.tolist())
        return self._offsets


_FLASH_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
_memo = threading.local()  # .starts / .mask: (weakref to the tensor, its _version, what was found): once per forward


def _remembered(name, tensor, extra, compute):
    """compute() once per (tensor object, its in-place version, extra): transformers hands every layer of a forward
    the same position_ids and mask, so a forward pays for one look, not one per layer."""
    entry = getattr(_memo, name, None)
    version = getattr(tensor, "_version", None)
    if entry is not None and entry[0]() is tensor and entry[1] == version and entry[2] == extra:
        return entry[3]
    result = compute()
    try:
        setattr(_memo, name, (weakref.ref(tensor), version, extra, result))
    except TypeError:  # not weak-referenceable: not remembered
        pass
    return result


def sequence_offsets(position_ids):
    """cu_seqlens (int32 tensor on position_ids' device) and their host list for a packed row of position ids
    ([1, n] or [n]), or None where they hold one sequence. A sequence starts at token 0 and wherever a position is not
    the previous one plus 1: the boundaries transformers' masks use (masking_utils.find_packed_sequence_indices), and
    its flash path's (a restart at 0) for position ids that restart at 0."""
    positions = position_ids.reshape(-1)
    n = positions.shape[0]
    if n < 2:
        return None
    starts = torch.nonzero(positions[1:] != positions[:-1] + 1).reshape(-1) + 1
    if starts.shape[0] == 0:
        return None
    edges = torch.tensor([0, n], dtype=starts.dtype, device=starts.device)
    cu = torch.cat((edges[:1], starts, edges[1:])).to(torch.int32)
    return cu, cu.tolist()


def packed_sequences(query, key, attention_mask, kwargs):
    """The Packing of a transformers call that is a packed batch, as transformers' flash-attention path decides it
    (modeling_flash_attention_utils): all four of cu_seq_lens_q / cu_seq_lens_k / max_length_q / max_length_k given
    (DataCollatorWithFlattening(return_flash_attn_kwargs=True)), or position_ids restarting within a batch of one row
    (DataCollatorWithFlattening's default); else None. Not with a KV cache of earlier tokens (n_k != n_q: where
    those tokens' sequences end is unknown), nor for one query token. With a batch of several rows only from the
    flash kwargs and without an attention mask (flash's rule: a padding mask wins)."""
    batch, n_q = query.shape[0], query.shape[2]
    if all(kwargs.get(name) is not None for name in _FLASH_KWARGS):
        if batch > 1 and attention_mask is not None:
            return None
        return Packing(kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"], kwargs["max_length_q"],
                       kwargs["max_length_k"], derived=False)
    position_ids = kwargs.get("position_ids")
    if position_ids is None or batch != 1 or n_q < 2 or key.shape[2] != n_q:
        return None
    if getattr(position_ids, "dim", lambda: 0)() not in (1, 2) or position_ids.shape[-1] != n_q or \
            position_ids.numel() != n_q:
        return None
    found = _remembered("starts", position_ids, n_q, lambda: sequence_offsets(position_ids))
    if found is None:
        return None
    cu, offsets = found
    longest = max(b - a for a, b in zip(offsets, offsets[1:]))
    return Packing(cu, cu, longest, longest, derived=True, offsets=(offsets, offsets))


def packing_mask(offsets_q, offsets_k, causal, sliding_window, device):
    """The bool mask [1, 1, total_q, total_k] of a packed call: a query sees its own sequence's keys only (causal:
    bottom-right per sequence; sliding_window: the last sliding_window keys, transformers' rule), or None where it
    cannot be spelt (query and key offsets of different sequence counts)."""
    if len(offsets_q) != len(offsets_k):
        return None
    lengths_q = torch.tensor([b - a for a, b in zip(offsets_q, offsets_q[1:])], device=device)
    lengths_k = torch.tensor([b - a for a, b in zip(offsets_k, offsets_k[1:])], device=device)
    sequences = torch.arange(lengths_q.shape[0], device=device)
    sequence_q = torch.repeat_interleave(sequences, lengths_q)
    sequence_k = torch.repeat_interleave(sequences, lengths_k)
    keep = sequence_q[:, None] == sequence_k[None, :]
    if causal or sliding_window is not None:
        # each row's position from its sequence's end, bottom-right aligned: key j is visible to query i when
        # j's distance before its end is at least i's
        start_q, start_k = torch.tensor(offsets_q[:-1], device=device), torch.tensor(offsets_k[:-1], device=device)
        row = torch.arange(offsets_q[-1], device=device) - start_q[sequence_q] - lengths_q[sequence_q]
        col = torch.arange(offsets_k[-1], device=device) - start_k[sequence_k] - lengths_k[sequence_k]
        if causal:
            keep &= col[None, :] <= row[:, None]
        if sliding_window is not None:
            keep &= row[:, None] - col[None, :] < sliding_window
    return keep[None, None]


def _mask_is_the_packing(attention_mask, packing, causal, sliding_window):
    """Whether transformers' mask says no more than the packing does (a block-diagonal, causal per sequence: what its
    sdpa mask is for packed position_ids without a cache), checked once per mask object."""
    if attention_mask.dtype != torch.bool or attention_mask.shape[0] != 1 or attention_mask.shape[1] != 1:
        return False
    offsets_q, offsets_k = packing.offsets()
    if tuple(attention_mask.shape[2:]) != (offsets_q[-1], offsets_k[-1]):
        return False

    def compare():
        expected = packing_mask(offsets_q, offsets_k, causal, sliding_window, attention_mask.device)
        return expected is not None and bool(torch.equal(attention_mask, expected))
    return _remembered("mask", attention_mask, (tuple(offsets_q), tuple(offsets_k), causal, sliding_window), compare)


def _tokens(tensor):
    """[b, h, n, d] as the packed [b * n, h, d] (a view for b = 1)."""
    batch, heads, tokens, dim = tensor.shape
    if batch == 1:
        return tensor[0].transpose(0, 1)
    return tensor.transpose(1, 2).reshape(batch * tokens, heads, dim)


def _packed_attention(module, query, key, value, attention_mask, scaling, dropout, packing, kwargs):
    """A packed transformers call: sagegen.sageattn_varlen over the flattened tokens, or PyTorch per sequence (with
    one warning per reason) where sagegen cannot run it."""
    is_causal = kwargs.pop("is_causal", None)
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    window = kwargs.get("sliding_window")
    reason = _transformers_refusal(query, key, value, None, dropout, kwargs)
    if reason is None and window is not None and packing.max_k > window:
        reason = f"sliding_window={window}: a sliding window is not supported"
    if reason is None and attention_mask is not None and \
            not _mask_is_the_packing(attention_mask, packing, causal, None):
        reason = "an attention mask beyond the packed sequences' own (padding, a window, a custom one) is not supported"
    batch, heads, tokens, dim = query.shape
    q, k, v = _tokens(query), _tokens(key), _tokens(value)
    if reason is None:
        out = _sageattn_varlen(q, k, v, packing.cu_q, packing.cu_k, packing.max_q, packing.max_k, is_causal=causal,
                               sm_scale=scaling, check_offsets=not packing.derived)
        return out.reshape(batch, tokens, heads, dim), None
    say_once(_TRANSFORMERS_DOOR, f"packed sequences: {reason}")
    plain = attention_mask is None and not dropout and (window is None or packing.max_k <= window) and \
        all(kwargs.get(name) is None for name in ("softcap", "head_mask", "output_attentions"))
    if plain:  # one SDPA per sequence
        out = torch_varlen_attention(q, k, v, packing.cu_q, packing.cu_k, causal, scaling)
        return out.reshape(batch, tokens, heads, dim), None
    # transformers' SDPA function over the flattened tokens, with the packing's mask and the caller's (both must hold)
    offsets_q, offsets_k = packing.offsets()
    mask = packing_mask(offsets_q, offsets_k, causal, window, query.device)
    if mask is None:
        raise SageUnsupportedError(f"packed sequences: {reason}, and cu_seq_lens_q / cu_seq_lens_k hold different "
                                   "sequence counts")
    if attention_mask is not None:
        mask = mask & attention_mask if attention_mask.dtype == torch.bool else \
            attention_mask.masked_fill(~mask, torch.finfo(attention_mask.dtype).min)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    flat = [t.transpose(1, 2).reshape(1, batch * t.shape[2], t.shape[1], dim).transpose(1, 2)
            for t in (query, key, value)]
    out, weights = sdpa_attention_forward(module, *flat, mask, dropout=dropout, scaling=scaling, **kwargs)
    return out.reshape(batch, tokens, heads, dim), weights


def register_transformers(name="sagegen"):
    """transformers' official hook: AttentionInterface.register(name, ...), then load or build a model with
    attn_implementation=name. The attention masks are SDPA's (AttentionMaskInterface, where this transformers has
    it): None for plain causal prefill, which is what runs on sagegen. Returns the name."""
    from transformers import AttentionInterface
    AttentionInterface.register(name, transformers_attention)
    try:
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:  # older transformers: masks are built per attn_implementation inside the models
        pass
    else:
        AttentionMaskInterface.register(name, sdpa_mask)
    return name


# ---- diffusers ----

def patch_diffusers():
    """A monkey-patch: diffusers' "sage" backend (diffusers.models.attention_dispatch) calls sageattn(q, k, v,
    tensor_layout="NHD", is_causal, sm_scale, return_lse) imported from SageAttention; this points its module
    globals at sagegen.integrations.sageattn and marks the backend usable. Then use diffusers' own API:
    `pipe.transformer.set_attention_backend("sage")` or `with attention_backend("sage"):`. Returns the patched
    module. (Without patching: diffusers' default "native" backend calls torch's SDPA, which
    `with sagegen.sdpa():` routes.)"""
    from diffusers.models import attention_dispatch
    attention_dispatch.sageattn = sageattn
    attention_dispatch._CAN_USE_SAGE_ATTN = True
    return attention_dispatch
