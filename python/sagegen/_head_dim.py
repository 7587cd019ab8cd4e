"""Which head dim sageattn runs a call at: the library's rule (sage_attention_head_dim, runtime/src/HeadDimChoice.cpp),
decided by the schedules' own supports(): the caller's dim where a kernel takes it, else the next dim with a kernel,
or on sm_90a a faster one for the presets whose padded calls were measured. Zero-padding Q, K and V along the head
dim is exact: the zero channels add nothing to Q.K^T or to O, and the quantizers' statistics of the real channels do
not change. The caller's softmax scale is folded into Q, and O's padded channels are cut off. No torch needed here."""

import ctypes
import os
import threading

from ._library import DTYPE_BF16, DTYPE_F16, check, library

_choices = {}  # (preset, head_dim, tokens_kv, capability, dtype, block_mask, $SAGEGEN_SCHEDULE) -> head dim
_choices_lock = threading.Lock()
_CHOICES = 4096  # bounded: many lengths clear the cache rather than grow it


def kernel_head_dim(head_dim, tokens_kv, preset, capability, block_mask=False, bf16=False):
    """The head dim to run a call of `head_dim` at. capability: the device's (major, minor); block_mask: the call
    passes one; bf16: the inputs' dtype. $SAGEGEN_SCHEDULE restricts the choice as it does the runner's. Dims no
    kernel can take come back unchanged, for the library to refuse."""
    key = (preset, head_dim, tokens_kv, capability, bool(bf16), bool(block_mask), os.environ.get("SAGEGEN_SCHEDULE"))
    chosen = _choices.get(key)
    if chosen is None:
        result = ctypes.c_int()
        check(library().sage_attention_head_dim(preset.encode(), int(head_dim), int(tokens_kv),
                                                capability[0] * 10 + capability[1], DTYPE_BF16 if bf16 else DTYPE_F16,
                                                int(bool(block_mask)), ctypes.byref(result)))
        chosen = result.value
        with _choices_lock:
            if len(_choices) >= _CHOICES:
                _choices.clear()
            _choices[key] = chosen
    return chosen
