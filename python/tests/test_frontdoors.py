"""The host fast path (issue 24: Attention's call plans) and the front doors' checks and fallbacks (issue 28),
without PyTorch or a GPU: a fake torch module and a fake library stand in, so what the library is handed on every
call can be read back. Runs with `python3 python/tests/test_frontdoors.py` (and under pytest)."""

import contextlib
import os
import sys
import threading
import types
import unittest
from unittest import mock
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import sagegen  # noqa: E402
from sagegen import _library, _torch  # noqa: E402



class Device:
    def __init__(self, kind, index=None):
        self.type, self.index = kind, index


_pointers = iter(range(0x100000, 1 << 40, 0x10000))
CUDA0 = Device("cuda", 0)  # one object, as equal torch.device objects are one key


class Tensor:
    """shape, stride(), dtype, device, data_ptr() and numel(), as torch.Tensor has them; a fresh pointer each."""

    def __init__(self, shape, dtype="torch.float16", device=None, strides=None, pointer=None):
        self.shape, self.dtype, self.device = tuple(shape), dtype, device or CUDA0
        self._pointer = pointer or next(_pointers)
        if strides is None:
            strides, step = [], 1
            for size in reversed(self.shape):
                strides.insert(0, step)
                step *= size
        self._strides = tuple(strides)

    def stride(self):
        return self._strides

    def data_ptr(self):
        return self._pointer

    def numel(self):
        count = 1
        for size in self.shape:
            count *= size
        return count


class FakeCuda:
    def __init__(self, owner):
        self.owner = owner

    def is_current_stream_capturing(self):
        return self.owner.capturing

    def get_device_capability(self, device):
        return (9, 0)

    def current_stream(self, device):
        return "stream"

    def stream(self, stream):
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def device(self, index):
        self.owner.guards.append(index)
        yield


class FakeTorch:
    """What Attention.__call__ uses of torch: empty, float32, uint8, cuda.*, and torch._C's raw getters."""
    float32, uint8 = "torch.float32", "torch.uint8"

    def __init__(self):
        self.current, self.guards, self.allocations, self.capturing, self.stream = 0, [], [], False, 0x5000
        self.cuda = FakeCuda(self)
        owner = self

        class C:
            @staticmethod
            def _cuda_getDevice():
                return owner.current

            @staticmethod
            def _cuda_getCurrentRawStream(device):
                return owner.stream + device
        self._C = C

    def empty(self, shape, dtype, device):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.allocations.append((shape, dtype))
        return Tensor(shape, dtype, device if not isinstance(device, int) else Device("cuda", device))


class FakeLibrary:
    """Records what each sage_attention_run sees: the descriptions behind RunArgs' pointers."""

    def __init__(self):
        self.runs, self.workspace_queries, self.workspace_size = [], 0, 4096

    def sage_attention_create(self, config, handle):
        handle._obj.value = 0x1234
        return 0

    def sage_attention_destroy(self, handle):
        pass

    def sage_attention_workspace_bytes(self, handle, layout, q, k, size):
        self.workspace_queries += 1
        size._obj.value = self.workspace_size
        return 0

    def sage_attention_run(self, handle, args_ref):
        args = args_ref._obj

        def seen(pointer):
            if not pointer:
                return None
            desc = pointer.contents
            return (desc.data, tuple(desc.shape[:desc.ndim]), tuple(desc.strides[:desc.ndim]), desc.dtype,
                    desc.device)
        self.runs.append({"q": seen(args.q), "k": seen(args.k), "v": seen(args.v), "o": seen(args.o),
                          "lse": seen(args.lse), "block_mask": seen(args.block_mask), "layout": args.layout,
                          "phase": args.phase, "workspace": (args.workspace, args.workspace_bytes),
                          "stream": args.stream})
        return 0


class FakedTest(unittest.TestCase):
    def setUp(self):
        self.torch, self.library = FakeTorch(), FakeLibrary()
        self.saved = sagegen._torch_module, sagegen.library
        sagegen._torch_module, sagegen.library = self.torch, lambda: self.library
        sagegen._small_workspaces.clear()

    def tearDown(self):
        sagegen._torch_module, sagegen.library = self.saved


def qkv(shape=(1, 8, 128, 64), **kwargs):
    return Tensor(shape, **kwargs), Tensor(shape, **kwargs), Tensor(shape, **kwargs)


class PlanCacheTest(FakedTest):
    def test_a_repeated_call_reuses_its_plan_with_the_new_pointers(self):
        attention = sagegen.Attention("sage-b", head_dim=64)
        q, k, v = qkv()
        attention(q, k, v)
        q2, k2, v2 = qkv()
        attention(q2, k2, v2)
        first, second = self.library.runs
        self.assertEqual(len(attention._local.plans), 1)
        self.assertEqual(self.library.workspace_queries, 1)  # the size came from the plan the second time
        self.assertEqual(first["q"][0], q.data_ptr())
        self.assertEqual(second["q"][0], q2.data_ptr())
        self.assertEqual((second["k"][0], second["v"][0]), (k2.data_ptr(), v2.data_ptr()))
        self.assertNotEqual(first["o"][0], second["o"][0])  # a fresh out each call
        self.assertEqual(second["stream"], 0x5000)
        self.assertEqual(first["workspace"], second["workspace"])  # kept per (device, stream)
        self.assertEqual(second["workspace"][1], 4096)

    def test_a_changed_stride_or_shape_makes_a_new_plan(self):
        attention = sagegen.Attention("sage-b", head_dim=64)
        q, k, v = qkv()
        attention(q, k, v)
        # Same shape, other strides (k as a transposed view of an NHD buffer): described again.
        k_view = Tensor((1, 8, 128, 64), strides=(8 * 128 * 64, 64, 8 * 64, 1))
        attention(q, k_view, v)
        self.assertEqual(self.library.runs[-1]["k"][2], (8 * 128 * 64, 64, 8 * 64, 1))
        attention(q, k, v)  # the first plan again: the contiguous strides
        self.assertEqual(self.library.runs[-1]["k"][2], (8 * 128 * 64, 128 * 64, 64, 1))
        # Another length: new shapes for q, o and the workspace size asked again.
        q3, k3, v3 = qkv((1, 8, 300, 64))
        attention(q3, k3, v3)
        run = self.library.runs[-1]
        self.assertEqual(run["q"][1], (1, 8, 300, 64))
        self.assertEqual(run["o"][1:3], ((1, 8, 300, 64), (8 * 300 * 64, 300 * 64, 64, 1)))
        self.assertEqual(len(attention._local.plans), 3)
        self.assertEqual(self.library.workspace_queries, 2)  # the library's size depends on shapes, not strides
        # A changed layout or phase is a different plan too.
        attention(q, k, v, layout="NHD")
        self.assertEqual(self.library.runs[-1]["layout"], _library.LAYOUT_NHD)
        attention(q, k, v, phase=sagegen.PHASE_PROLOGUE)
        self.assertEqual(self.library.runs[-1]["phase"], sagegen.PHASE_PROLOGUE)

    def test_bad_inputs_are_refused_after_a_good_call_of_the_same_shape(self):
        attention = sagegen.Attention("sage-b", head_dim=64)
        q, k, v = qkv()
        attention(q, k, v)
        cases = [
            ("q: is in host memory", lambda: attention(Tensor(q.shape, device=Device("cpu")), k, v)),
            ("k: dtype float64", lambda: attention(q, Tensor(k.shape, dtype="torch.float64"), v)),
            ("v: expected a tensor, got None", lambda: attention(q, k, None)),
            ("v: expected a tensor", lambda: attention(q, k, [1, 2])),
            ("tensor_layout", lambda: attention(q, k, v, layout="BHSD")),
            ("tensor_layout", lambda: attention(q, k, v, layout=["HND"])),  # unhashable: the slow path says so
            ("phase", lambda: attention(q, k, v, phase=7)),
            ("q: expected a 4-D tensor", lambda: attention(Tensor((8, 128, 64)), k, v)),
            ("q: expected dtype f16", lambda: sagegen.Attention("sage-b", head_dim=64, dtype="f16")(
                Tensor(q.shape, dtype="torch.bfloat16"), k, v)),
            ("workspace: expected a 1-D uint8", lambda: attention(q, k, v, workspace=Tensor((4096,)))),
            ("workspace: expected a 1-D uint8", lambda: attention(
                q, k, v, workspace=Tensor((4096,), dtype="torch.uint8", device=Device("cuda", 1)))),
            ("o: dtype float64", lambda: attention(q, k, v, out=Tensor(q.shape, dtype="torch.float64"))),
            ("stream: is on", lambda: attention(q, k, v, stream=type("S", (), {"device": "cuda:1"})())),
        ]
        runs = len(self.library.runs)
        for message, call in cases:
            for _ in range(2):  # a refusal is never cached: the second time raises the same
                with self.assertRaises(sagegen.SageArgumentError) as caught:
                    call()
                self.assertIn(message, str(caught.exception))
        self.assertEqual(len(self.library.runs), runs)  # nothing refused reached the library

    def test_no_lse_allocated_unless_written_and_nothing_when_out_and_workspace_are_given(self):
        q, k, v = qkv()
        sagegen.Attention("sage-b", head_dim=64)(q, k, v)
        self.assertEqual(self.torch.allocations[0], ((1, 8, 128, 64), "torch.float16"))
        self.assertEqual(self.torch.allocations[1:], [((4096,), "torch.uint8")])  # the kept workspace, once
        self.assertIsNone(self.library.runs[-1]["lse"])
        self.torch.allocations.clear()
        out, lse = sagegen.Attention("sage-b", head_dim=64, lse=True)(q, k, v)
        self.assertEqual(lse.shape, (1, 8, 128))
        self.assertEqual(self.library.runs[-1]["lse"][1:3], ((1, 8, 128), (8 * 128, 128, 1)))
        self.assertEqual(self.library.runs[-1]["lse"][0], lse.data_ptr())
        self.torch.allocations.clear()
        attention = sagegen.Attention("sage-b", head_dim=64)
        out, workspace = Tensor(q.shape), Tensor((4096,), dtype="torch.uint8")
        for _ in range(3):
            self.assertIs(attention(q, k, v, out=out, workspace=workspace), out)
        self.assertEqual(self.torch.allocations, [])
        self.assertEqual(self.library.runs[-1]["workspace"], (workspace.data_ptr(), 4096))
        self.assertEqual(self.library.runs[-1]["o"][0], out.data_ptr())

    def test_the_device_guard_only_when_q_is_not_on_the_current_device(self):
        attention = sagegen.Attention("sage-b", head_dim=64)
        q, k, v = qkv()
        attention(q, k, v)
        self.assertEqual(self.torch.guards, [])
        self.torch.current = 1
        attention(q, k, v)
        self.assertEqual(self.torch.guards, [0])
        cuda1 = Device("cuda", 1)
        q1, k1, v1 = qkv(device=cuda1)
        attention(q1, k1, v1)
        self.assertEqual(self.torch.guards, [0])
        self.assertEqual(self.library.runs[-1]["stream"], 0x5001)
        self.assertEqual(self.library.runs[-1]["q"][4], 1)

    def test_each_thread_has_its_own_plans(self):
        attention = sagegen.Attention("sage-b", head_dim=64)
        q, k, v = qkv()
        attention(q, k, v)
        seen = []
        thread = threading.Thread(target=lambda: (attention(q, k, v), seen.append(len(attention._local.plans))))
        thread.start()
        thread.join()
        self.assertEqual(seen, [1])
        self.assertEqual(len(self.library.runs), 2)
        self.assertEqual(self.library.runs[0]["q"], self.library.runs[1]["q"])

    def test_workspace_bytes_is_cached_per_signature(self):
        attention = sagegen.Attention("sage-b", head_dim=64)
        q, k, v = qkv()
        self.assertEqual(attention.workspace_bytes(q, k), 4096)
        self.assertEqual(attention.workspace_bytes(*qkv()[:2]), 4096)
        self.assertEqual(self.library.workspace_queries, 1)
        attention.workspace_bytes(*qkv((1, 8, 256, 64))[:2])
        self.assertEqual(self.library.workspace_queries, 2)
        with self.assertRaises(sagegen.SageArgumentError) as caught:
            attention.workspace_bytes(Tensor(q.shape, device=Device("cpu")), k)
        self.assertIn("q: is in host memory", str(caught.exception))


class EagerTensor(Tensor):
    """Exactly the class the stand-in torch calls Tensor (dispatcher_free asks type(t) is torch.Tensor)."""
    requires_grad, is_cuda = False, True

    def dim(self):
        return len(self.shape)

    def __mul__(self, factor):
        scaled = EagerTensor(self.shape, self.dtype, self.device, self._strides)
        scaled.factor = factor
        return scaled


class EagerTorch(FakeTorch):
    """FakeTorch plus what sageattn asks of torch on its eager route."""
    Tensor, float16, bfloat16 = EagerTensor, "torch.float16", "torch.bfloat16"

    def __init__(self):
        super().__init__()
        self.compiler = type("Compiler", (), {"is_compiling": staticmethod(lambda: False)})
        self.ops = None  # the op route must not be taken here

    @staticmethod
    def is_grad_enabled():
        return True

    def empty(self, shape, dtype, device):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.allocations.append((shape, dtype))
        return EagerTensor(shape, dtype, device if not isinstance(device, int) else Device("cuda", device))


class EagerSageattnTest(FakedTest):
    """sagegen.sageattn's eager route (no dispatcher) through the call plans, with the fake torch and library."""

    def setUp(self):
        super().setUp()
        self.torch = EagerTorch()
        sagegen._torch_module = self.torch
        self.saved_torch = _torch.torch, getattr(_torch, "_get_current_dispatch_mode", None), dict(_torch._attentions)
        _torch.torch, _torch._get_current_dispatch_mode = self.torch, lambda: None
        _torch._attentions.clear()
        self.saved_bound, _torch._bound = _torch._bound, threading.local()
        # The head-dim rule is the library's (tested in test_checks.py): here every dim has a kernel.
        self.saved_rule, _torch.kernel_head_dim = _torch.kernel_head_dim, lambda head_dim, *args: head_dim

    def tearDown(self):
        _torch.torch, mode, attentions = self.saved_torch
        if mode is None:
            del _torch._get_current_dispatch_mode
        else:
            _torch._get_current_dispatch_mode = mode
        _torch._attentions.clear()
        _torch._attentions.update(attentions)
        _torch._bound, _torch.kernel_head_dim = self.saved_bound, self.saved_rule
        super().tearDown()

    def test_a_repeated_call_is_bound_once_and_passes_its_new_pointers(self):
        q, k, v = (EagerTensor((1, 8, 128, 64)) for _ in range(3))
        outs = [sagegen.sageattn(q, k, v, is_causal=True, preset="sage2-fp8") for _ in range(3)]
        self.assertEqual(len(_torch._bound.calls), 1)
        runs = self.library.runs[-3:]
        self.assertEqual([run["o"][0] for run in runs], [out.data_ptr() for out in outs])  # fresh out per call
        self.assertEqual(len({run["workspace"][0] for run in runs}), 1)  # a small workspace: the stream's, held
        self.assertEqual({run["stream"] for run in runs}, {0x5000})  # the current stream of q's device
        q2, k2, v2 = (EagerTensor((1, 8, 128, 64)) for _ in range(3))  # new tensors, same signature: same binding
        sagegen.sageattn(q2, k2, v2, is_causal=True, preset="sage2-fp8")
        self.assertEqual(len(_torch._bound.calls), 1)
        self.assertEqual([self.library.runs[-1][name][0] for name in "qkv"], [t.data_ptr() for t in (q2, k2, v2)])
        self.assertEqual(self.library.workspace_queries, 1)

    def test_only_small_workspaces_are_held_and_never_under_capture(self):
        q, k, v = (EagerTensor((1, 8, 128, 64)) for _ in range(3))
        pointers = lambda runs: {run["workspace"][0] for run in runs}  # noqa: E731
        for _ in range(2):
            sagegen.sageattn(q, k, v)
        self.torch.stream = 0x6000  # another stream: its own
        for _ in range(2):
            sagegen.sageattn(q, k, v)
        self.assertEqual(len(pointers(self.library.runs[:2])), 1)
        self.assertEqual(len(pointers(self.library.runs)), 2)
        self.assertEqual(len(sagegen._small_workspaces), 2)
        self.torch.capturing = True  # a graph's workspace comes from its pool: per call
        for _ in range(2):
            sagegen.sageattn(q, k, v)
        self.assertEqual(len(pointers(self.library.runs[-2:])), 2)
        self.torch.capturing = False
        self.library.workspace_size = (8 << 20) + 256  # large: per call, from the caching allocator
        big = [EagerTensor((1, 8, 4096, 64)) for _ in range(3)]
        for _ in range(2):
            sagegen.sageattn(*big)
        self.assertEqual(len(pointers(self.library.runs[-2:])), 2)
        self.assertEqual([run["workspace"][1] for run in self.library.runs[-2:]], [(8 << 20) + 256] * 2)
        self.assertEqual(len(sagegen._small_workspaces), 2)

    def test_what_changes_a_call_binds_it_anew(self):
        q, k, v = (EagerTensor((1, 8, 128, 64)) for _ in range(3))
        sagegen.sageattn(q, k, v)
        strided = EagerTensor((1, 8, 128, 64), strides=(8 * 128 * 128, 64, 8 * 64, 1))  # NHD memory read as HND
        sagegen.sageattn(strided, k, v)
        self.assertEqual(self.library.runs[-1]["q"][2], (8 * 128 * 128, 64, 8 * 64, 1))
        sagegen.sageattn(q, k, v, is_causal=True)
        sagegen.sageattn(q, k, v, return_lse=True)
        sagegen.sageattn(q, k, v, preset="sage2-fp8")
        sagegen.sageattn(q, k, v, sm_scale=64 ** -0.5)  # the kernels' own scale: no fold, bound
        self.assertEqual(len(_torch._bound.calls), 6)
        for _ in range(2):  # a scale to fold into q: the full path each time (a scaled copy of q)
            sagegen.sageattn(q, k, v, sm_scale=0.25)
            self.assertNotEqual(self.library.runs[-1]["q"][0], q.data_ptr())
        self.assertEqual(len(_torch._bound.calls), 6)

    def test_a_bound_call_still_refuses_what_its_key_does_not_hold(self):
        q, k, v = (EagerTensor((1, 8, 128, 64)) for _ in range(3))
        sagegen.sageattn(q, k, v, smooth_k=True)
        with self.assertRaises(sagegen.SageArgumentError) as caught:  # 1 == True, but not a bool
            sagegen.sageattn(q, k, v, smooth_k=1)
        self.assertTrue(str(caught.exception).startswith("smooth_k:"))
        runs = len(self.library.runs)
        q.requires_grad = True  # gradients wanted: the op route (which refuses at backward time), not the binding
        with self.assertRaises(AttributeError):  # EagerTorch has no ops: the call reached the op route
            sagegen.sageattn(q, k, v, smooth_k=True)
        self.assertEqual(len(self.library.runs), runs)

    def test_sageattn_runs_through_the_plans_and_allocates_lse_only_when_returned(self):
        q, k, v = (EagerTensor((2, 256, 8, 64)) for _ in range(3))
        out = sagegen.sageattn(q, k, v, tensor_layout="NHD", is_causal=True, smooth_k=True, attn_mask=None)
        run = self.library.runs[-1]
        self.assertEqual(run["layout"], _library.LAYOUT_NHD)
        self.assertIsNone(run["lse"])
        self.assertEqual(run["o"][0], out.data_ptr())
        self.assertEqual([a for a in self.torch.allocations if a[1] == "torch.float32"], [])  # no lse
        out, lse = sagegen.sageattn(q, k, v, tensor_layout="NHD", sm_scale=0.5, return_lse=True)
        run = self.library.runs[-1]
        self.assertEqual(lse.shape, (2, 8, 256))  # [b, h, n] in both layouts
        self.assertEqual(run["lse"][0], lse.data_ptr())
        self.assertIn(((2, 8, 256), "torch.float32"), self.torch.allocations)
        self.assertNotEqual(run["q"][0], q.data_ptr())  # sm_scale 0.5 != 1/sqrt(64): a scaled copy of q
        for _ in range(3):
            sagegen.sageattn(q, k, v, tensor_layout="NHD", is_causal=True)
        workspaces = [run["workspace"] for run in self.library.runs[-3:]]
        self.assertEqual([size for _, size in workspaces], [4096] * 3)
        self.assertEqual(len({pointer for pointer, _ in workspaces}), 1)  # small: the stream's held workspace
        self.assertEqual(len(_torch._bound.calls), 2)  # with and without options; the sm_scale call is not bound
        self.assertEqual(len(_torch._attentions), 2)
        self.assertEqual(self.library.workspace_queries, 2)  # one shape: one size query per Attention (lse or not)

    def test_sageattn_refuses_before_any_work(self):
        q, k, v = (EagerTensor((2, 8, 256, 64)) for _ in range(3))
        cases = [
            (sagegen.SageUnsupportedError, "attn_mask", {"attn_mask": EagerTensor((1, 1, 256, 256))}),
            (sagegen.SageUnsupportedError, "smooth_k", {"smooth_k": False}),
            (sagegen.SageArgumentError, "sm_scale", {"sm_scale": -1.0}),
            (sagegen.SageArgumentError, "tensor_layout", {"tensor_layout": "BHSD"}),
            (sagegen.SageArgumentError, "window_size", {"window_size": 3}),
        ]
        for error, argument, kwargs in cases:
            with self.assertRaises(error) as caught:
                sagegen.sageattn(q, k, v, **kwargs)
            self.assertTrue(str(caught.exception).startswith(argument + ":"), str(caught.exception))
        self.assertEqual(self.library.runs, [])


class SageAttentionOptionsTest(unittest.TestCase):
    """What diffusers', ComfyUI's and SGLang's Sage callers pass: accepted where the kernels do it, else refused
    naming the argument (checked before any tensor is looked at)."""

    def check(self, preset="sage-b", **options):
        _torch._check_sageattention_options(preset, options)

    def test_accepted(self):
        self.check(smooth_k=True, smooth_v=False, attn_mask=None, dropout_p=0.0, quantization_backend="triton")
        self.check(qk_quant_gran="per_block", pv_accum_dtype="fp16")
        self.check("sage2-fp8", qk_quant_gran="per_warp", pv_accum_dtype="fp32+fp32")
        self.check("exact", smooth_k=False)  # nothing quantized: nothing to smooth

    def test_refused_naming_the_argument(self):
        cases = [
            (sagegen.SageUnsupportedError, "smooth_k", {"smooth_k": False}),
            (sagegen.SageArgumentError, "smooth_k", {"smooth_k": "yes"}),
            (sagegen.SageUnsupportedError, "smooth_v", {"smooth_v": True}),
            (sagegen.SageUnsupportedError, "attn_mask", {"attn_mask": object()}),
            (sagegen.SageUnsupportedError, "dropout_p", {"dropout_p": 0.1}),
            (sagegen.SageArgumentError, "dropout_p", {"dropout_p": 2.0}),
            (sagegen.SageUnsupportedError, "qk_quant_gran", {"qk_quant_gran": "per_thread"}),
            (sagegen.SageUnsupportedError, "pv_accum_dtype", {"pv_accum_dtype": "fp32+fp16"}),
            (sagegen.SageArgumentError, "quantization_backend", {"quantization_backend": "cpu"}),
        ]
        for error, argument, options in cases:
            with self.assertRaises(error) as caught:
                self.check(**options)
            self.assertTrue(str(caught.exception).startswith(argument + ":"), str(caught.exception))
        with self.assertRaises(sagegen.SageUnsupportedError) as caught:
            self.check(qk_quant_gran="per_warp")
        self.assertIn("sage2-fp8", str(caught.exception))  # says which preset computes it


class TorchStandIn:
    """torch as fallback_reason and the doors see it: Tensor, the two dtypes, is_grad_enabled."""
    float16, bfloat16 = "torch.float16", "torch.bfloat16"
    Tensor = Tensor

    @staticmethod
    def is_grad_enabled():
        return True


class DoorTensor(Tensor):
    def __init__(self, shape=(1, 128, 8, 64), dtype="torch.float16", device=None, requires_grad=False):
        super().__init__(shape, dtype, device)
        self.requires_grad = requires_grad

    def dim(self):
        return len(self.shape)


class FallbackOncePerReasonTest(unittest.TestCase):
    def setUp(self):
        from sagegen import integrations
        self.integrations = integrations
        self.saved = (_torch.torch, integrations.torch, integrations.torch_attention, integrations._strict_sageattn,
                      set(_torch._said))
        self.fallbacks, self.sage_calls = [], []
        _torch.torch = integrations.torch = TorchStandIn
        integrations.torch_attention = lambda *args: self.fallbacks.append(args) or "pytorch"
        integrations._strict_sageattn = lambda *args, **kwargs: self.sage_calls.append(args) or "sagegen"
        _torch._said.clear()

    def tearDown(self):
        (_torch.torch, self.integrations.torch, self.integrations.torch_attention, self.integrations._strict_sageattn,
         said) = self.saved
        _torch._said.clear()
        _torch._said.update(said)

    def calls(self, door):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            results = [door() for _ in range(3)]
        return results, [str(w.message) for w in caught]

    def test_each_reason_warns_once_and_runs_pytorch(self):
        sageattn = self.integrations.sageattn
        cpu = dict(device=Device("cpu"))
        cases = [
            ("only CUDA tensors", lambda: sageattn(DoorTensor(**cpu), DoorTensor(**cpu), DoorTensor(**cpu),
                                                   tensor_layout="NHD")),
            ("dtype torch.float32", lambda: sageattn(*(DoorTensor(dtype="torch.float32") for _ in range(3)))),
            ("mixed dtypes", lambda: sageattn(DoorTensor(), DoorTensor(dtype="torch.bfloat16"), DoorTensor())),
            ("require grad", lambda: sageattn(DoorTensor(requires_grad=True), DoorTensor(), DoorTensor())),
            ("attn_mask", lambda: sageattn(DoorTensor(), DoorTensor(), DoorTensor(), attn_mask=DoorTensor())),
            ("dropout", lambda: sageattn(DoorTensor(), DoorTensor(), DoorTensor(), dropout_p=0.1)),
        ]
        for expected, door in cases:
            results, messages = self.calls(door)
            self.assertEqual(results, ["pytorch"] * 3, expected)
            self.assertEqual(len(messages), 1, (expected, messages))
            self.assertIn("sagegen.integrations.sageattn: falling back to PyTorch", messages[0])
            self.assertIn(expected, messages[0])
        self.assertEqual(self.sage_calls, [])
        self.assertEqual(len(self.fallbacks), 3 * len(cases))

    def test_an_unsupported_refusal_falls_back_and_an_argument_error_is_raised(self):
        def unsupported(*args, **kwargs):
            raise sagegen.SageUnsupportedError("q: head dim 96: no kernel")
        self.integrations._strict_sageattn = unsupported
        results, messages = self.calls(lambda: self.integrations.sageattn(DoorTensor(), DoorTensor(), DoorTensor()))
        self.assertEqual(results, ["pytorch"] * 3)
        self.assertEqual(len(messages), 1)
        self.assertIn("head dim 96", messages[0])

        def wrong(*args, **kwargs):
            raise sagegen.SageArgumentError("k: expected 8 heads")
        self.integrations._strict_sageattn = wrong
        with self.assertRaises(sagegen.SageArgumentError):
            self.integrations.sageattn(DoorTensor(), DoorTensor(), DoorTensor())

    def test_no_fallback_drops_a_block_mask(self):
        cpu = Device("cpu")
        with self.assertRaises(sagegen.SageUnsupportedError) as caught:
            self.integrations.sageattn(DoorTensor(device=cpu), DoorTensor(device=cpu), DoorTensor(device=cpu),
                                       block_mask=DoorTensor((1, 8, 1, 2)))
        self.assertTrue(str(caught.exception).startswith("block_mask:"), str(caught.exception))
        self.assertEqual(self.fallbacks, [])

    def test_runnable_inputs_go_to_sagegen_with_their_arguments(self):
        result = self.integrations.sageattn(DoorTensor(), DoorTensor(), DoorTensor(), tensor_layout="NHD",
                                            is_causal=True, sm_scale=0.5, return_lse=True)
        self.assertEqual(result, "sagegen")
        self.assertEqual(self.sage_calls[0][3:], ("NHD", True, 0.5, True))

    def test_transformers_door_decides_causal_as_sdpa_and_falls_back_for_masks(self):
        door = self.integrations.transformers_attention
        module = type("Module", (), {"is_causal": True})()
        q, k, v = DoorTensor((1, 8, 128, 64)), DoorTensor((1, 2, 128, 64)), DoorTensor((1, 2, 128, 64))

        class Out:
            def transpose(self, a, b):
                self.dims = (a, b)
                return self

            def contiguous(self):
                return self
        self.integrations._strict_sageattn = lambda *args: self.sage_calls.append(args) or Out()
        out, weights = door(module, q, k, v, None, scaling=0.125)
        self.assertIsNone(weights)
        self.assertEqual(out.dims, (1, 2))
        self.assertEqual(self.sage_calls[-1][3:], ("HND", True, 0.125))
        door(module, q, k, v, None, is_causal=False)  # the caller's is_causal wins over the module's
        self.assertFalse(self.sage_calls[-1][4])
        door(module, DoorTensor((1, 8, 1, 64)), k, v, None)  # one query token: not causal, as SDPA decides
        self.assertFalse(self.sage_calls[-1][4])
        door(type("Encoder", (), {"is_causal": False})(), q, k, v, None)
        self.assertFalse(self.sage_calls[-1][4])
        calls = len(self.sage_calls)
        # A padding mask goes to transformers' own SDPA function: a stand-in here, whether or not transformers is
        # installed (the real one needs real tensors).
        fallbacks = []
        sdpa_module = types.ModuleType("transformers.integrations.sdpa_attention")
        sdpa_module.sdpa_attention_forward = lambda *args, **kwargs: fallbacks.append((args, kwargs)) or ("sdpa", None)
        stand_ins = {"transformers": types.ModuleType("transformers"),
                     "transformers.integrations": types.ModuleType("transformers.integrations"),
                     "transformers.integrations.sdpa_attention": sdpa_module}
        with mock.patch.dict(sys.modules, stand_ins), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mask = DoorTensor((1, 1, 128, 128))
            self.assertEqual(door(module, q, k, v, mask), ("sdpa", None))
        self.assertEqual(len(self.sage_calls), calls)
        self.assertIs(fallbacks[0][0][4], mask)
        self.assertIn("sagegen (transformers attention): falling back", str(caught[0].message))
        self.assertIn("attn_mask", str(caught[0].message))


# ---- transformers: packed (padding-free) batches (issue 28) ----

class Row:
    """A 1-D integer tensor, as far as sequence_offsets and packed_sequences use one: slicing, + and != elementwise,
    reshape(-1), tolist(), dim(), numel(); `_version` as PyTorch counts in-place changes."""

    def __init__(self, values, dtype="torch.int64", device=None):
        self.values, self.dtype, self.device, self._version = list(values), dtype, device or CUDA0, 0

    @property
    def shape(self):
        return (len(self.values),)

    def dim(self):
        return 1

    def numel(self):
        return len(self.values)

    def reshape(self, *shape):
        return Row(self.values, self.dtype, self.device)

    def __getitem__(self, index):
        return Row(self.values[index], self.dtype, self.device)

    def __add__(self, other):
        return Row([v + other for v in self.values], self.dtype, self.device)

    def __ne__(self, other):
        return Row([a != b for a, b in zip(self.values, other.values)], "torch.bool", self.device)

    def to(self, dtype):
        return Row(self.values, dtype, self.device)

    def tolist(self):
        return list(self.values)


class PositionIds(Row):
    """position_ids [1, n]: shape and dim() of a 2-D row."""

    @property
    def shape(self):
        return (1, len(self.values))

    def dim(self):
        return 2


class PackedTorch(TorchStandIn):
    """What the packed route uses of torch, on Rows; counts nonzero() (one per sequence_offsets)."""
    int32, bool = "torch.int32", "torch.bool"
    nonzero_calls = 0

    @classmethod
    def nonzero(cls, row):
        cls.nonzero_calls += 1
        return Row([i for i, value in enumerate(row.values) if value], device=row.device)

    @staticmethod
    def tensor(values, dtype=None, device=None):
        return Row(values, dtype, device)

    @staticmethod
    def cat(rows):
        return Row([v for row in rows for v in row.values], rows[0].dtype, rows[0].device)


class Heads(DoorTensor):
    """[b, h, n, d] with the views the packed route takes ([0], transpose, reshape): shapes only."""

    def __getitem__(self, index):
        return Heads(self.shape[1:], self.dtype, self.device)

    def transpose(self, a, b):
        shape = list(self.shape)
        shape[a], shape[b] = shape[b], shape[a]
        return Heads(shape, self.dtype, self.device, self.requires_grad)

    def reshape(self, *shape):
        return Heads(shape, self.dtype, self.device, self.requires_grad)

    def contiguous(self):
        return self


class PackedTransformersTest(unittest.TestCase):
    def setUp(self):
        from sagegen import integrations
        self.integrations = integrations
        names = ("torch", "_sageattn_varlen", "torch_varlen_attention", "_strict_sageattn", "_mask_is_the_packing",
                 "packing_mask")
        self.saved = (_torch.torch, {name: getattr(integrations, name) for name in names}, set(_torch._said))
        _torch.torch = integrations.torch = PackedTorch
        PackedTorch.nonzero_calls = 0
        self.varlen_calls, self.per_sequence, self.dense_calls = [], [], []
        integrations._sageattn_varlen = lambda *args, **kwargs: self.varlen_calls.append((args, kwargs)) or \
            Heads((args[0].shape[0], args[0].shape[1], args[0].shape[2]))
        integrations.torch_varlen_attention = lambda *args: self.per_sequence.append(args) or \
            Heads((args[0].shape[0], args[0].shape[1], args[0].shape[2]))
        integrations._strict_sageattn = lambda *args: self.dense_calls.append(args) or Heads(args[0].shape)
        integrations._memo.__dict__.clear()
        _torch._said.clear()
        self.module = type("Module", (), {"is_causal": True})()

    def tearDown(self):
        _torch.torch, names, said = self.saved
        for name, value in names.items():
            setattr(self.integrations, name, value)
        _torch._said.clear()
        _torch._said.update(said)

    def qkv(self, tokens=9, batch=1, dtype="torch.float16"):
        return Heads((batch, 8, tokens, 64), dtype), Heads((batch, 2, tokens, 64), dtype), \
            Heads((batch, 2, tokens, 64), dtype)

    def test_cu_seqlens_from_position_ids_restarting_or_jumping(self):
        offsets = self.integrations.sequence_offsets
        cu, host = offsets(PositionIds([0, 1, 2, 0, 1, 0, 1, 2, 3]))
        self.assertEqual(host, [0, 3, 5, 9])
        self.assertEqual((cu.dtype, cu.tolist()), ("torch.int32", [0, 3, 5, 9]))
        self.assertEqual(offsets(PositionIds([5, 6, 7, 0, 1]))[1], [0, 3, 5])  # a sequence starts where +1 breaks
        self.assertEqual(offsets(PositionIds([0, 1, 2, 3, 4, 2, 3]))[1], [0, 5, 7])  # not only at 0: as the masks do
        self.assertIsNone(offsets(PositionIds([0, 1, 2, 3])))  # one sequence
        self.assertIsNone(offsets(PositionIds([7, 8, 9])))
        self.assertIsNone(offsets(PositionIds([0])))

    def test_which_calls_are_packed(self):
        packed = self.integrations.packed_sequences
        q, k, _ = self.qkv()
        restarts = PositionIds([0, 1, 2, 0, 1, 0, 1, 2, 3])
        found = packed(q, k, None, {"position_ids": restarts})
        self.assertEqual((found.cu_q.tolist(), found.max_q, found.max_k, found.derived), ([0, 3, 5, 9], 4, 4, True))
        self.assertIs(found.cu_q, found.cu_k)
        self.assertIsNone(packed(q, k, None, {"position_ids": PositionIds(range(9))}))  # an ordinary forward
        self.assertIsNone(packed(q, k, None, {}))
        self.assertIsNone(packed(*self.qkv(batch=2)[:2], None, {"position_ids": restarts}))  # flash: one row only
        self.assertIsNone(packed(Heads((1, 8, 1, 64)), Heads((1, 2, 1, 64)), None,
                                 {"position_ids": PositionIds([3])}))  # decoding one token
        self.assertIsNone(packed(q, Heads((1, 2, 20, 64)), None, {"position_ids": restarts}))  # a cache of earlier keys
        # The flash kwargs, all four, win (DataCollatorWithFlattening(return_flash_attn_kwargs=True)); not checked here.
        cu_q, cu_k = Row([0, 4, 9], "torch.int32"), Row([0, 4, 9], "torch.int32")
        flash = {"cu_seq_lens_q": cu_q, "cu_seq_lens_k": cu_k, "max_length_q": 5, "max_length_k": 5,
                 "position_ids": restarts}
        found = packed(q, k, None, flash)
        self.assertEqual((found.cu_q, found.cu_k, found.max_q, found.derived), (cu_q, cu_k, 5, False))
        found = packed(*self.qkv(tokens=4, batch=2)[:2], None, dict(flash, position_ids=None))
        self.assertIs(found.cu_q, cu_q)  # several rows flattened, as flash does
        self.assertIsNone(packed(*self.qkv(tokens=4, batch=2)[:2], DoorTensor((2, 1, 4, 4)), flash))  # a mask wins
        self.assertIsNotNone(packed(q, k, None, dict(flash, max_length_k=None)))  # three of four: position_ids decide

    def test_position_ids_are_read_once_per_forward(self):
        q, k, v = self.qkv()
        restarts = PositionIds([0, 1, 2, 0, 1, 0, 1, 2, 3])
        for _ in range(4):  # four layers, one forward: the same position_ids object
            self.integrations.transformers_attention(self.module, q, k, v, None, position_ids=restarts)
        self.assertEqual(PackedTorch.nonzero_calls, 1)
        restarts._version += 1  # changed in place: looked at again
        self.integrations.transformers_attention(self.module, q, k, v, None, position_ids=restarts)
        self.assertEqual(PackedTorch.nonzero_calls, 2)
        self.assertEqual(len(self.varlen_calls), 5)

    def test_packed_calls_run_sageattn_varlen_on_the_flattened_tokens(self):
        q, k, v = self.qkv()
        out, weights = self.integrations.transformers_attention(
            self.module, q, k, v, None, scaling=0.125, position_ids=PositionIds([0, 1, 2, 0, 1, 0, 1, 2, 3]))
        self.assertIsNone(weights)
        self.assertEqual(out.shape, (1, 9, 8, 64))  # [b, n, h, d], as transformers expects
        (packed_q, packed_k, packed_v, cu_q, cu_k, max_q, max_k), options = self.varlen_calls[-1]
        self.assertEqual((packed_q.shape, packed_k.shape, packed_v.shape), ((9, 8, 64), (9, 2, 64), (9, 2, 64)))
        self.assertEqual((cu_q.tolist(), cu_k.tolist(), max_q, max_k), ([0, 3, 5, 9], [0, 3, 5, 9], 4, 4))
        self.assertEqual(options, {"is_causal": True, "sm_scale": 0.125, "check_offsets": False})
        self.integrations.transformers_attention(type("Encoder", (), {"is_causal": False})(), q, k, v, None,
                                                 position_ids=PositionIds([0, 1, 2, 0, 1, 0, 1, 2, 3]))
        self.assertFalse(self.varlen_calls[-1][1]["is_causal"])
        cu = Row([0, 4, 9], "torch.int32")
        self.integrations.transformers_attention(self.module, q, k, v, None, is_causal=False, cu_seq_lens_q=cu,
                                                 cu_seq_lens_k=cu, max_length_q=5, max_length_k=5)
        self.assertEqual(self.varlen_calls[-1][0][3:], (cu, cu, 5, 5))
        self.assertEqual(self.varlen_calls[-1][1], {"is_causal": False, "sm_scale": None, "check_offsets": True})
        # Not packed: the dense route, as before.
        self.integrations.transformers_attention(self.module, q, k, v, None, position_ids=PositionIds(range(9)))
        self.assertEqual(len(self.dense_calls), 1)
        self.assertEqual(len(self.varlen_calls), 3)

    def test_a_mask_that_is_the_packing_runs_on_sagegen_and_any_other_goes_to_sdpa_with_both(self):
        q, k, v = self.qkv()
        restarts = PositionIds([0, 1, 2, 0, 1, 0, 1, 2, 3])
        checked = []
        self.integrations._mask_is_the_packing = lambda mask, packing, causal, window: checked.append(mask) or True
        mask = DoorTensor((1, 1, 9, 9), dtype="torch.bool")
        self.integrations.transformers_attention(self.module, q, k, v, mask, position_ids=restarts)
        self.assertEqual((len(self.varlen_calls), checked), (1, [mask]))  # transformers' own mask for packed ids

        class Mask:
            dtype = "torch.bool"

            def __init__(self, name):
                self.name = name

            def __and__(self, other):
                return Mask(f"{self.name} & {other.name}")
        self.integrations._mask_is_the_packing = lambda *args: False
        self.integrations.packing_mask = lambda offsets_q, offsets_k, causal, window, device: \
            Mask(f"packing {offsets_q} causal={causal} window={window}")
        forwarded = []
        sdpa_module = types.ModuleType("transformers.integrations.sdpa_attention")
        sdpa_module.sdpa_attention_forward = lambda module, q, k, v, mask, **kwargs: \
            forwarded.append((q.shape, mask.name, kwargs)) or (Heads((1, 9, 8, 64)), None)
        stand_ins = {"transformers": types.ModuleType("transformers"),
                     "transformers.integrations": types.ModuleType("transformers.integrations"),
                     "transformers.integrations.sdpa_attention": sdpa_module}
        with mock.patch.dict(sys.modules, stand_ins), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out, _ = self.integrations.transformers_attention(self.module, q, k, v, Mask("padding"),
                                                              position_ids=restarts)
            self.integrations.transformers_attention(self.module, q, k, v, None, position_ids=restarts,
                                                     sliding_window=3)
        self.assertEqual(out.shape, (1, 9, 8, 64))
        self.assertEqual(forwarded[0][:2], ((1, 8, 9, 64), "packing [0, 3, 5, 9] causal=True window=None & padding"))
        self.assertEqual(forwarded[1][1], "packing [0, 3, 5, 9] causal=True window=3")  # longest sequence 4 > 3
        self.assertEqual(len(self.varlen_calls), 1)
        messages = [str(w.message) for w in caught]
        self.assertEqual(len(messages), 2, messages)
        self.assertIn("packed sequences: an attention mask beyond", messages[0])
        self.assertIn("sliding_window=3", messages[1])

    def test_what_sagegen_cannot_run_falls_back_per_sequence_once_per_reason(self):
        q, k, v = self.qkv(dtype="torch.float32")
        restarts = PositionIds([0, 1, 2, 0, 1, 0, 1, 2, 3])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                out, _ = self.integrations.transformers_attention(self.module, q, k, v, None, scaling=0.5,
                                                                  position_ids=restarts)
        self.assertEqual(out.shape, (1, 9, 8, 64))
        self.assertEqual(self.varlen_calls, [])
        self.assertEqual(len(self.per_sequence), 3)
        packed_q, _, _, cu_q, cu_k, causal, scale = self.per_sequence[0]
        self.assertEqual((packed_q.shape, cu_q.tolist(), cu_k.tolist(), causal, scale),
                         ((9, 8, 64), [0, 3, 5, 9], [0, 3, 5, 9], True, 0.5))
        self.assertEqual(len(caught), 1)
        self.assertIn("sagegen (transformers attention): falling back", str(caught[0].message))
        self.assertIn("packed sequences: dtype torch.float32", str(caught[0].message))


class ShimTest(unittest.TestCase):
    def test_install_sageattention_makes_the_import_work_and_keeps_a_real_one(self):
        from sagegen import integrations
        saved = sys.modules.pop("sageattention", None)
        try:
            module = integrations.install_sageattention()
            from sageattention import sageattn
            self.assertIs(sageattn, integrations.sageattn)
            self.assertIs(integrations.install_sageattention(), sys.modules["sageattention"])
            real = sys.modules["sageattention"] = type(sys)("sageattention")
            self.assertIs(integrations.install_sageattention(), real)  # a real SageAttention stays
            self.assertIsNot(integrations.install_sageattention(force=True), real)
            self.assertTrue(module.__sagegen_shim__)
        finally:
            sys.modules.pop("sageattention", None)
            if saved is not None:
                sys.modules["sageattention"] = saved


if __name__ == "__main__":
    unittest.main()
