"""SageBwd with an explicit backward preset, for the SageBwd benches (issue 25).

`sagegen.sagebwd_attention` pairs its forward preset with a backward preset itself (`sagebwd`, or `sagebwd-rot-qks` for
a rotated forward: sagegen._backward.paired_presets). To measure another backward preset beside it (e.g. sagebwd-rot:
one P/dS scale per tile), `with_backward_preset` runs sagegen's own autograd.Function (`SageBwdFunction`: the same
eager route, the same forward kernel and LSE) with the backward preset replaced.
"""

import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from sagegen._backward import SageBwdFunction  # noqa: E402


class _WithBackwardPreset(SageBwdFunction):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, forward_preset, backward_preset):
        out, lse = SageBwdFunction.forward(ctx, q, k, v, causal, scale, forward_preset)
        ctx.backward_preset = backward_preset
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        return SageBwdFunction.backward(ctx, grad_out, grad_lse) + (None,)


def with_backward_preset(q, k, v, causal, forward_preset, backward_preset):
    """o = softmax(q k^T / sqrt(d)) v from `forward_preset`'s kernel; its gradients from `backward_preset`'s kernels."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    return _WithBackwardPreset.apply(q, k, v, bool(causal), scale, forward_preset, backward_preset)[0]
