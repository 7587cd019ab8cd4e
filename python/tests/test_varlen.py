"""sageattn_varlen and Attention.varlen without PyTorch or a GPU (issue 28): the Python-side checks, what the library
is handed for a packed call (fake library and torch from test_frontdoors.py), the offsets' value checks (skipped
under CUDA-graph capture and with check_offsets=False) and the fallback to PyTorch once per reason. Runs with
`python3 python/tests/test_varlen.py`; the kernels' numbers are python/tests/test_varlen_gpu.py's."""

import ctypes
import os
import sys
import threading
import unittest
from unittest import mock
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import sagegen  # noqa: E402
from sagegen import _library, _torch, _varlen  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_frontdoors import Device, FakedTest, FakeLibrary, FakeTorch, Tensor  # noqa: E402

INT32 = "torch.int32"


class OffsetsTensor(Tensor):
    """An int32 [batch + 1] tensor whose values a test sets (what tolist() reads back)."""

    def __init__(self, values, device=None):
        super().__init__((len(values),), INT32, device)
        self.values = list(values)

    def tolist(self):
        return list(self.values)


def packed(lengths_q=(1, 0, 77, 128), lengths_k=(5, 3, 77, 200), heads_q=8, heads_kv=2, head_dim=64, **kwargs):
    """q, k, v and both offsets for these lengths."""
    cu_q, cu_k = [0], [0]
    for a, b in zip(lengths_q, lengths_k):
        cu_q.append(cu_q[-1] + a)
        cu_k.append(cu_k[-1] + b)
    q = Tensor((cu_q[-1], heads_q, head_dim), **kwargs)
    k, v = (Tensor((cu_k[-1], heads_kv, head_dim), **kwargs) for _ in range(2))
    return q, k, v, OffsetsTensor(cu_q, kwargs.get("device")), OffsetsTensor(cu_k, kwargs.get("device"))


class VarlenLibrary(FakeLibrary):
    """FakeLibrary plus the packed entry points: records what each sees."""

    def __init__(self):
        super().__init__()
        self.varlen_runs, self.varlen_sizes = [], []

    def sage_attention_varlen_workspace_bytes(self, handle, batch, heads_q, heads_kv, max_q, max_k, size):
        self.varlen_sizes.append((batch, heads_q, heads_kv, max_q, max_k))
        size._obj.value = 8192
        return 0

    def sage_attention_run_varlen(self, handle, args_ref):
        args = args_ref._obj

        def seen(pointer):
            if not pointer:
                return None
            desc = pointer.contents
            return (desc.data, tuple(desc.shape[:desc.ndim]), tuple(desc.strides[:desc.ndim]), desc.dtype)
        self.varlen_runs.append({name: seen(getattr(args, name)) for name in (
            "q", "k", "v", "o", "lse", "cu_seqlens_q", "cu_seqlens_kv")} | {
            "max": (args.max_seqlen_q, args.max_seqlen_kv), "alignment": args.causal_alignment,
            "workspace": (args.workspace, args.workspace_bytes), "stream": args.stream})
        return 0


class LibraryTest(unittest.TestCase):
    def test_the_library_has_the_varlen_entry_points_and_refuses_a_null_handle_by_name(self):
        library = _library.library()  # the real one ($SAGEGEN_LIBRARY or the build's)
        self.assertTrue(hasattr(library, "sage_attention_run_varlen"))
        args = _library.VarlenArgs()
        status = library.sage_attention_run_varlen(None, ctypes.byref(args))
        self.assertEqual(status, 1)
        self.assertTrue(library.sage_last_error().decode().startswith("attention:"))
        size = ctypes.c_size_t()
        self.assertEqual(library.sage_attention_varlen_workspace_bytes(None, 2, 8, 8, 128, 128, ctypes.byref(size)), 1)


class AttentionVarlenTest(FakedTest):
    def setUp(self):
        super().setUp()
        self.library = VarlenLibrary()
        sagegen.library = lambda: self.library

    def test_the_library_gets_the_packed_descriptions_offsets_and_maxima(self):
        attention = sagegen.Attention("sage-b", head_dim=64, causal=True, lse=True)
        q, k, v, cu_q, cu_k = packed()
        out, lse = attention.varlen(q, k, v, cu_q, cu_k, 128, 200)
        run, = self.library.varlen_runs
        self.assertEqual(run["q"][:2], (q.data_ptr(), (206, 8, 64)))
        self.assertEqual(run["k"][1], (285, 2, 64))
        self.assertEqual(run["o"][1:3], ((206, 8, 64), (8 * 64, 64, 1)))
        self.assertEqual(run["lse"][1:], ((8, 206), (206, 1), _library.DTYPE_F32))  # [h_q, total_q]
        self.assertEqual(run["cu_seqlens_q"], (cu_q.data_ptr(), (5,), (1,), _library.DTYPE_I32))
        self.assertEqual(run["cu_seqlens_kv"][0], cu_k.data_ptr())
        self.assertEqual(run["max"], (128, 200))
        self.assertEqual(run["alignment"], _library.CAUSAL_BOTTOM_RIGHT)  # FlashAttention's, per sequence
        self.assertEqual(self.library.varlen_sizes, [(4, 8, 2, 128, 200)])  # batch = sequences
        self.assertEqual(run["workspace"][1], 8192)
        self.assertEqual(out.shape, q.shape)
        self.assertEqual(lse.shape, (8, 206))
        # The size is asked once per (batch, heads, maxima).
        attention.varlen(*packed(), 128, 200)
        self.assertEqual(len(self.library.varlen_sizes), 1)

    def test_a_strided_q_view_is_passed_with_its_strides(self):
        attention = sagegen.Attention("sage-b", head_dim=64)
        _, k, v, cu_q, cu_k = packed()
        q = Tensor((206, 8, 64), strides=(3 * 8 * 64, 64, 1))  # q of a fused QKV projection
        attention.varlen(q, k, v, cu_q, cu_k, 128, 200)
        self.assertEqual(self.library.varlen_runs[-1]["q"][2], (3 * 8 * 64, 64, 1))

    def test_bad_calls_are_refused_naming_the_argument_before_the_library(self):
        attention = sagegen.Attention("sage-b", head_dim=64)
        q, k, v, cu_q, cu_k = packed()
        cases = [
            ("q: expected a 3-D tensor", lambda: attention.varlen(Tensor((1, 206, 8, 64)), k, v, cu_q, cu_k, 8, 8)),
            ("q: is in host memory", lambda: attention.varlen(Tensor(q.shape, device=Device("cpu")), k, v, cu_q,
                                                              cu_k, 8, 8)),
            ("k: expected a 3-D tensor", lambda: attention.varlen(q, Tensor((285, 128)), v, cu_q, cu_k, 8, 8)),
            ("max_seqlen_q", lambda: attention.varlen(q, k, v, cu_q, cu_k, 0, 8)),
            ("max_seqlen_k", lambda: attention.varlen(q, k, v, cu_q, cu_k, 8, True)),
            ("cu_seqlens_q: dtype float64", lambda: attention.varlen(q, k, v, Tensor((5,), "torch.float64"), cu_k,
                                                                     8, 8)),
        ]
        for message, call in cases:
            with self.assertRaises(sagegen.SageArgumentError) as caught:
                call()
            self.assertIn(message, str(caught.exception))
        self.assertEqual(self.library.varlen_runs, [])


class VarlenTorch(FakeTorch):
    """What sageattn_varlen asks of torch besides the fake allocations: cat (of the offsets), a capture flag."""
    float16, bfloat16, float32 = "torch.float16", "torch.bfloat16", "torch.float32"
    Tensor = Tensor

    def __init__(self):
        super().__init__()
        self.copies = 0
        self.cuda.is_available = lambda: True
        self.cuda.get_device_capability = lambda device: (9, 0)

    def cat(self, tensors):
        self.copies += 1
        return OffsetsTensor([value for tensor in tensors for value in tensor.values])

    @staticmethod
    def is_grad_enabled():
        return False


class VarlenFixture(FakedTest):
    """sageattn_varlen with the fake library and torch, its module's state saved and restored."""

    def setUp(self):
        super().setUp()
        self.library, self.torch = VarlenLibrary(), VarlenTorch()
        sagegen.library, sagegen._torch_module = (lambda: self.library), self.torch
        self.saved_varlen = (_varlen.torch, _torch.torch, _varlen.kernel_head_dim, _varlen.torch_varlen_attention,
                      dict(_torch._attentions), set(_torch._said))
        _varlen.torch = _torch.torch = self.torch
        _varlen.kernel_head_dim = lambda head_dim, *args: head_dim  # every dim has a kernel here
        self.fallbacks = []
        _varlen.torch_varlen_attention = lambda *args: self.fallbacks.append(args) or "pytorch"
        _torch._attentions.clear()
        _torch._said.clear()
        self.saved_bound, _varlen._bound = _varlen._bound, threading.local()

    def tearDown(self):
        _varlen._bound = self.saved_bound
        (_varlen.torch, _torch.torch, _varlen.kernel_head_dim, _varlen.torch_varlen_attention, attentions,
         said) = self.saved_varlen
        _torch._attentions.clear()
        _torch._attentions.update(attentions)
        _torch._said.clear()
        _torch._said.update(said)
        super().tearDown()


class SageattnVarlenTest(VarlenFixture):
    def test_a_good_call_runs_packed_with_one_offsets_copy(self):
        q, k, v, cu_q, cu_k = packed()
        out = sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 128, 200, is_causal=True)
        self.assertEqual(out.shape, q.shape)
        self.assertEqual(self.torch.copies, 1)
        self.assertEqual(len(self.library.varlen_runs), 1)
        self.assertEqual(self.library.varlen_runs[0]["alignment"], _library.CAUSAL_BOTTOM_RIGHT)
        sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 128, 200, is_causal=True, causal_alignment="top-left")
        self.assertEqual(self.library.varlen_runs[1]["alignment"], _library.CAUSAL_TOP_LEFT)

    def test_bad_offset_values_are_refused_naming_the_argument(self):
        cases = [
            ([1, 1, 78, 206, 206], None, None, "cu_seqlens_q: must start at 0"),
            ([0, 1, 0, 206, 206], None, None, "cu_seqlens_q: must be non-decreasing"),
            ([0, 1, 1, 78, 205], None, None, "cu_seqlens_q: the last entry (205)"),
            (None, [0, 5, 8, 85, 284], None, "cu_seqlens_k: the last entry (284)"),
            (None, None, (127, 200), "max_seqlen_q: 127 is below sequence 3's length 128"),
            (None, None, (128, 199), "max_seqlen_k: 199"),
        ]
        for values_q, values_k, maxima, message in cases:
            q, k, v, cu_q, cu_k = packed()
            cu_q.values = values_q or cu_q.values
            cu_k.values = values_k or cu_k.values
            with self.assertRaises(sagegen.SageArgumentError) as caught:
                sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, *(maxima or (128, 200)))
            self.assertIn(message, str(caught.exception))
        self.assertEqual(self.library.varlen_runs, [])

    def test_the_values_are_not_read_under_capture_or_when_turned_off(self):
        q, k, v, cu_q, cu_k = packed()
        cu_q.values = [7, 0, 0, 0, 0]  # wrong, but only the kernels see it (they clamp)
        sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 128, 200, check_offsets=False)
        self.torch.capturing = True
        sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 128, 200)
        self.assertEqual(self.torch.copies, 0)
        self.assertEqual(len(self.library.varlen_runs), 2)

    def test_descriptor_checks_name_the_argument(self):
        q, k, v, cu_q, cu_k = packed()
        cases = [
            ("q: expected a 3-D tensor", lambda: sagegen.sageattn_varlen(Tensor((1, 206, 8, 64)), k, v, cu_q, cu_k,
                                                                          8, 8)),
            ("v: shape", lambda: sagegen.sageattn_varlen(q, k, Tensor((284, 2, 64)), cu_q, cu_k, 8, 8)),
            ("k: 3 heads must divide", lambda: sagegen.sageattn_varlen(q, Tensor((285, 3, 64)),
                                                                        Tensor((285, 3, 64)), cu_q, cu_k, 8, 8)),
            ("cu_seqlens_q: expected dtype int32", lambda: sagegen.sageattn_varlen(
                q, k, v, Tensor((5,), "torch.int64"), cu_k, 8, 8)),
            ("cu_seqlens_k: is on", lambda: sagegen.sageattn_varlen(
                q, k, v, cu_q, OffsetsTensor(cu_k.values, Device("cpu")), 8, 8)),
            ("cu_seqlens_k: 4 entries", lambda: sagegen.sageattn_varlen(q, k, v, cu_q, OffsetsTensor([0, 1, 2, 3]),
                                                                        8, 8)),
            ("cu_seqlens_q: expected a 1-D", lambda: sagegen.sageattn_varlen(q, k, v, OffsetsTensor([0]), cu_k,
                                                                             8, 8)),
            ("max_seqlen_q: expected an int", lambda: sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 8.0, 8)),
            ("max_seqlen_k: expected an upper bound", lambda: sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 8, 0)),
            ("sm_scale", lambda: sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 128, 200, sm_scale=-1.0)),
            ("causal_alignment", lambda: sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 128, 200,
                                                                 causal_alignment="left")),
        ]
        for message, call in cases:
            with self.assertRaises(sagegen.SageArgumentError) as caught:
                call()
            self.assertIn(message, str(caught.exception))
        self.assertEqual(self.library.varlen_runs, [])

    def test_what_sagegen_cannot_run_falls_back_once_per_reason(self):
        class GradTensor(Tensor):
            requires_grad = True

        def unsupported(handle, args_ref):
            self.library.unsupported_calls = getattr(self.library, "unsupported_calls", 0) + 1
            return 2  # SAGE_UNSUPPORTED

        self.library.sage_last_error = lambda: b"packed (variable-length) calls of sla-f16: no schedule"
        cases = [
            ("only CUDA tensors", lambda: packed(device=Device("cpu"))),
            ("dtype torch.float32", lambda: packed(dtype="torch.float32")),
        ]
        for expected, make in cases:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for _ in range(3):
                    q, k, v, cu_q, cu_k = make()
                    self.assertEqual(sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 128, 200), "pytorch")
            self.assertEqual(len(caught), 1, expected)
            self.assertIn("sagegen.sageattn_varlen: falling back to PyTorch", str(caught[0].message))
            self.assertIn(expected, str(caught[0].message))
        self.library.sage_attention_run_varlen = unsupported
        with warnings.catch_warnings(record=True) as caught, mock.patch.object(_library, "library",
                                                                               lambda: self.library):
            warnings.simplefilter("always")
            for _ in range(2):
                self.assertEqual(sagegen.sageattn_varlen(*packed(), 128, 200, preset="sla-f16"), "pytorch")
        self.assertEqual(len(caught), 1)
        self.assertIn("no schedule", str(caught[0].message))
        self.assertEqual(self.library.unsupported_calls, 2)
        self.assertEqual(len(self.fallbacks), 8)

    def test_an_empty_batch_needs_no_kernel(self):
        q, k, v, cu_q, cu_k = packed(lengths_q=(0, 0), lengths_k=(3, 4))
        self.torch.zeros_like = lambda tensor: "zeros"
        self.torch.full = lambda shape, value, dtype, device: ("full", shape, value)
        out, lse = sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 1, 4, return_lse=True)
        self.assertEqual((out, lse), ("zeros", ("full", (8, 0), float("-inf"))))
        self.assertEqual(self.library.varlen_runs, [])


class VersionedOffsets(OffsetsTensor):
    """Offsets with PyTorch's version counter: a test bumps it where PyTorch would (an in-place write)."""
    _version = 0

    def write(self, values):
        self.values = list(values)
        self._version += 1


class InferenceOffsets(OffsetsTensor):
    """An inference-mode tensor: reading its version counter raises, as PyTorch's does."""

    @property
    def _version(self):
        raise RuntimeError("Inference tensors do not track version counter.")


class BoundVarlenTest(VarlenFixture):
    """A repeated packed call: bound once (descriptions and VarlenArgs kept), its offsets' values checked once per
    (tensor, version)."""

    def versioned(self, kind=VersionedOffsets, **kwargs):
        q, k, v, cu_q, cu_k = packed(**kwargs)
        return q, k, v, kind(cu_q.values), kind(cu_k.values)

    def test_a_repeated_call_is_bound_and_passes_its_new_pointers(self):
        q, k, v, cu_q, cu_k = self.versioned()
        out, lse = sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 128, 200, is_causal=True, return_lse=True)
        q2, k2, v2, cu_q2, cu_k2 = self.versioned()
        out2, lse2 = sagegen.sageattn_varlen(q2, k2, v2, cu_q2, cu_k2, 128, 200, is_causal=True, return_lse=True)
        self.assertEqual(len(_varlen._bound.calls), 1)
        first, second = self.library.varlen_runs
        self.assertEqual(self.library.varlen_sizes, [(4, 8, 2, 128, 200)])  # sized once
        for name, tensor in (("q", q2), ("k", k2), ("v", v2), ("o", out2), ("lse", lse2), ("cu_seqlens_q", cu_q2),
                             ("cu_seqlens_kv", cu_k2)):
            self.assertEqual(second[name][0], tensor.data_ptr(), name)
        self.assertNotEqual(first["o"][0], second["o"][0])  # a fresh out each call
        self.assertEqual(second["o"][1:3], ((206, 8, 64), (8 * 64, 64, 1)))
        self.assertEqual(second["lse"][1:], ((8, 206), (206, 1), _library.DTYPE_F32))
        self.assertEqual((second["max"], second["alignment"]), ((128, 200), _library.CAUSAL_BOTTOM_RIGHT))
        self.assertEqual(first["workspace"], second["workspace"])  # the stream's held workspace
        self.assertEqual((out2.shape, lse2.shape), (q.shape, (8, 206)))
        # Other maxima, options or strides: another binding, each sized and described in full.
        sagegen.sageattn_varlen(q2, k2, v2, cu_q2, cu_k2, 128, 256, is_causal=True, return_lse=True)
        sagegen.sageattn_varlen(q2, k2, v2, cu_q2, cu_k2, 128, 200, is_causal=True, causal_alignment="top-left")
        self.assertEqual(len(_varlen._bound.calls), 3)
        self.assertEqual(self.library.varlen_runs[-1]["alignment"], _library.CAUSAL_TOP_LEFT)
        self.assertEqual(self.library.varlen_runs[-2]["max"], (128, 256))

    def test_the_same_offsets_are_copied_once_until_written(self):
        q, k, v, cu_q, cu_k = self.versioned()
        for _ in range(3):
            sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 128, 200)
        self.assertEqual(self.torch.copies, 1)
        cu_q.write([0, 1, 1, 78, 206])  # still valid: checked again
        sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 128, 200)
        self.assertEqual(self.torch.copies, 2)
        _, _, _, other_q, other_k = self.versioned()  # equal values in other tensors: checked again
        sagegen.sageattn_varlen(q, k, v, other_q, other_k, 128, 200)
        self.assertEqual(self.torch.copies, 3)
        self.assertEqual(len(self.library.varlen_runs), 5)
        cu_k.write([0, 5, 8, 85, 300])  # wrong last entry: refused on the bound path too, before the library
        with self.assertRaises(sagegen.SageArgumentError) as caught:
            sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 128, 200)
        self.assertIn("cu_seqlens_k: the last entry (300)", str(caught.exception))
        self.assertEqual(len(self.library.varlen_runs), 5)
        with self.assertRaises(sagegen.SageArgumentError):  # and again: a refusal is not remembered as checked
            sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 128, 200)
        sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 128, 200, check_offsets=False)  # the caller's choice
        self.assertEqual(len(self.library.varlen_runs), 6)

    def test_offsets_without_a_version_counter_are_checked_every_call(self):
        q, k, v, cu_q, cu_k = self.versioned(InferenceOffsets)
        for _ in range(3):
            sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 128, 200)
        self.assertEqual(self.torch.copies, 3)
        self.assertEqual(len(_varlen._bound.calls), 1)

    def test_a_bound_call_still_falls_back_when_gradients_are_wanted(self):
        class GradTensor(Tensor):
            requires_grad = True

        q, k, v, cu_q, cu_k = self.versioned()
        sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 128, 200)
        self.torch.is_grad_enabled = lambda: True
        for tensor in (q, k, v):
            tensor.requires_grad = False
        grad_q = GradTensor(q.shape)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.assertEqual(sagegen.sageattn_varlen(grad_q, k, v, cu_q, cu_k, 128, 200), "pytorch")
        self.assertIn("no backward pass", str(caught[0].message))
        self.assertEqual(len(self.library.varlen_runs), 1)

    def test_a_call_with_a_scale_fold_is_not_bound(self):
        class ScaledTensor(Tensor):
            def __mul__(self, factor):
                return Tensor(self.shape, self.dtype, self.device, self._strides)

        _, k, v, cu_q, cu_k = self.versioned()
        q = ScaledTensor((206, 8, 64))
        for _ in range(2):
            sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 128, 200, sm_scale=0.5)  # folded into q
        self.assertFalse(getattr(_varlen._bound, "calls", None))
        self.assertEqual(len(self.library.varlen_runs), 2)


if __name__ == "__main__":
    unittest.main()
