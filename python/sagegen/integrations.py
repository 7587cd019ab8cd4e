"""Front doors for what users run (issue 28 item 3): each runs sagegen where it can and PyTorch's SDPA where it
cannot, warning once per reason why.

    sagegen.integrations.sageattn(q, k, v, tensor_layout="NHD", is_causal=False, sm_scale=None, return_lse=False)
        SageAttention's `sageattn` as ComfyUI, diffusers' sage backends and SGLang's diffusion backend call it.
    sagegen.integrations.install_sageattention()
        makes `import sageattention` give that function (for code that imports SageAttention by name).
    sagegen.integrations.register_transformers(name="sagegen")
        transformers' official hook: AttentionInterface.register, then attn_implementation="sagegen".
    sagegen.integrations.patch_diffusers()
        points diffusers' "sage" attention backend at sagegen (a monkey-patch of diffusers' module globals).

Fallback reasons: CPU (non-CUDA) tensors, dtypes other than float16/bfloat16 or mixed ones, inputs requiring grad,
attention masks, dropout, and whatever the library refuses as unsupported (a head dim without a kernel, an option
no preset computes: SageUnsupportedError). A caller's mistake (SageArgumentError) is raised, never hidden.
transformers and diffusers stay optional: nothing here imports them until asked to.
"""

import sys
import types

from ._library import SageUnsupportedError
from ._torch import fallback_reason, say_once, torch, torch_attention
from ._torch import sageattn as _strict_sageattn

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

def transformers_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """A transformers attention function: query [b, h_q, n_q, d], key/value [b, h_kv, n_kv, d]; returns
    (attn_output [b, n_q, h_q, d], None). Causal exactly as transformers' sdpa_attention_forward decides it
    (is_causal from kwargs or the module, only with several query tokens and no mask); GQA natively. Masks (padding,
    sliding windows the mask spells out), dropout, softcap, head_mask, output_attentions, CPU tensors, float32 and
    gradients go to transformers' own SDPA function, with one warning per reason."""
    is_causal = kwargs.pop("is_causal", None)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(query.shape[2] > 1 and attention_mask is None and causal)
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
