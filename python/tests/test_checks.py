"""sagegen's Python-side checks without PyTorch or a GPU: tiny fake tensors stand in for torch's. Run by CTest
(python_checks_test) when python3 is present; python/tests/test_gpu.py covers the rest on a GPU."""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import sagegen  # noqa: E402
from sagegen import _library, _tensors  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_frontdoors import Device, Tensor as FakeTensor  # noqa: E402


class DescribeTest(unittest.TestCase):
    def test_a_good_tensor_becomes_its_description(self):
        desc = _tensors.describe(FakeTensor((2, 8, 300, 64), device=Device("cuda", 1)), "q")
        self.assertEqual(desc.ndim, 4)
        self.assertEqual(list(desc.shape), [2, 8, 300, 64])
        self.assertEqual(list(desc.strides), [8 * 300 * 64, 300 * 64, 64, 1])
        self.assertEqual(desc.dtype, _library.DTYPE_F16)
        self.assertEqual(desc.device, 1)
        self.assertEqual(_tensors.describe(FakeTensor((4,), dtype="torch.bfloat16"), "k").dtype, _library.DTYPE_BF16)

    def test_host_tensors_are_described_as_host_memory_for_the_library_to_refuse(self):
        self.assertEqual(_tensors.describe(FakeTensor((1, 1, 1, 64), device=Device("cpu")), "v").device,
                         _library.HOST_MEMORY)

    def test_each_bad_tensor_raises_naming_the_argument(self):
        cases = [
            (FakeTensor((2, 8, 300, 64), dtype="torch.float64"), "q: dtype float64"),
            (FakeTensor((2, 8, 300, 64), device=Device("mps")), "q: is on a mps device"),
            (FakeTensor((1, 2, 8, 300, 64)), "q: expected 1 to 4 dimensions"),
            (None, "q: expected a tensor, got None"),
            ([1, 2, 3], "q: expected a tensor"),
        ]
        for tensor, message in cases:
            with self.assertRaises(sagegen.SageArgumentError) as caught:
                _tensors.describe(tensor, "q")
            self.assertIn(message, str(caught.exception))

    def test_layouts(self):
        self.assertEqual(_tensors.heads_tokens(FakeTensor((2, 8, 300, 64)), "HND", "q"), (2, 8, 300, 64))
        self.assertEqual(_tensors.heads_tokens(FakeTensor((2, 300, 8, 64)), "NHD", "q"), (2, 8, 300, 64))
        with self.assertRaises(sagegen.SageArgumentError) as caught:
            _tensors.layout_code("BHSD")
        self.assertIn("tensor_layout", str(caught.exception))
        with self.assertRaises(sagegen.SageArgumentError):
            _tensors.heads_tokens(FakeTensor((8, 300, 64)), "HND", "k")


class AttentionArgumentsTest(unittest.TestCase):
    def test_constructor_arguments_are_checked(self):
        for kwargs, argument in [({"dtype": "fp16"}, "dtype"), ({"head_dim": 0}, "head_dim"),
                                 ({"causal_alignment": "center"}, "causal_alignment"), ({"preset": 3}, "preset")]:
            with self.assertRaises(sagegen.SageArgumentError) as caught:
                sagegen.Attention(**kwargs)
            self.assertTrue(str(caught.exception).startswith(argument + ":"), str(caught.exception))

    def test_the_library_loads_and_matches_the_abi(self):
        library = _library.library()
        self.assertEqual(library.sage_abi_version(), _library.ABI_VERSION)
        self.assertTrue(sagegen.version())

    def test_status_codes_become_exception_types(self):
        # A bad config reaches the library's own checks: an argument error, by type.
        with self.assertRaises(sagegen.SageArgumentError) as caught:
            sagegen.Attention("no-such-preset", head_dim=64)._runner(0, _library.DTYPE_F16)
        self.assertIn("config.preset", str(caught.exception))

    def test_a_host_q_is_refused_before_any_device_work(self):
        attention = sagegen.Attention("sage-b", head_dim=64)
        q = FakeTensor((1, 1, 128, 64), device=Device("cpu"))
        with self.assertRaises(sagegen.SageArgumentError) as caught:
            attention.workspace_bytes(q, q)
        self.assertIn("q: is in host memory", str(caught.exception))


class BackwardTest(unittest.TestCase):
    """SageBwd (issue 12): the C ABI's backward entry points through ctypes, without a GPU."""

    def test_an_unknown_backward_preset_is_an_argument_error(self):
        from sagegen import _backward
        with self.assertRaises(sagegen.SageArgumentError) as caught:
            _backward._BackwardRunner("sage-b", 64, False, _library.DTYPE_F16, 0)
        self.assertIn("config.preset: unknown backward preset 'sage-b'", str(caught.exception))

    def test_rotated_forward_presets_train_with_the_per_key_and_query_backward(self):
        from sagegen import _backward
        self.assertEqual(_backward.paired_presets("sage-b", True), ("sage-b-rot", "sagebwd-rot-qks"))
        self.assertEqual(_backward.paired_presets("sage2-fp8-rot", None), ("sage2-fp8-rot", "sagebwd-rot-qks"))
        self.assertEqual(_backward.paired_presets("sage-b", None), ("sage-b", "sagebwd"))
        for preset in ("sagebwd-rot-qks", "sagebwd-rot-ks", "sagebwd"):  # known presets (no GPU here: a later refusal)
            try:
                _backward._BackwardRunner(preset, 128, False, _library.DTYPE_F16, 0)
            except sagegen.SageError as error:
                self.assertNotIn("unknown backward preset", str(error))

    def test_a_host_q_is_refused_before_any_device_work(self):
        from sagegen import _backward
        q = FakeTensor((1, 1, 128, 64), device=Device("cpu"))
        lse = FakeTensor((1, 1, 128), dtype="torch.float32", device=Device("cpu"))
        with self.assertRaises(sagegen.SageArgumentError) as caught:
            _backward.run_backward(q, q, q, q, lse, q, q, q, q, False, 0.0, None, None)
        self.assertIn("q: is in host memory", str(caught.exception))


class SlaTest(unittest.TestCase):
    """SLA (issue 13): the C ABI's SLA config through ctypes, without a GPU (refused before anything is compiled)."""

    def test_the_dtype_is_checked_in_python_and_by_the_library(self):
        from sagegen import _sla
        with self.assertRaises(sagegen.SageArgumentError) as caught:
            _sla.SlaKernels("sla-f16", 128, 5.0, 10.0, None, 0, "f32")
        self.assertTrue(str(caught.exception).startswith("dtype: expected one of ['bf16', 'f16']"),
                        str(caught.exception))
        # The config's last field reaches the library where sage_sla_c.h puts it (ctypes' layout is the header's).
        config = _sla.SlaConfig(b"sla-f16", 128, 5.0, 10.0, -1, 0, _library.DTYPE_F32)
        handle = _sla.ctypes.c_void_p()
        with self.assertRaises(sagegen.SageArgumentError) as caught:
            _library.check(_sla._declare_sla(_library.library()).sage_sla_create(_sla.ctypes.byref(config),
                                                                                 _sla.ctypes.byref(handle)))
        self.assertIn("config.dtype: expected SAGE_DTYPE_F16 (1), SAGE_DTYPE_BF16 (2) or 0 (f16), got 3",
                      str(caught.exception))


class MergeTest(unittest.TestCase):
    """The fused LSE merge (issue 30) through ctypes without a GPU: the library refuses before launching anything."""

    def test_merge_arguments_reach_the_library_in_the_headers_layout(self):
        from sagegen import _lse
        self.assertIsNotNone(_lse._merge_entry(), "the library exports sage_merge_attention")
        o = FakeTensor((1, 2, 16, 64), dtype="torch.float32", device=Device("cpu"))
        lse = FakeTensor((1, 2, 16), dtype="torch.float32", device=Device("cpu"))
        with self.assertRaises(sagegen.SageArgumentError) as caught:
            _lse.call_merge(o, lse, o, lse, o, lse, "HND", None)
        self.assertTrue(str(caught.exception).startswith("o_out: is in host memory"), str(caught.exception))
        # The layout is the first field, lse_out the last pointer before the stream: each reaches its argument.
        desc = _tensors.describe(o, "o")
        args = _lse.MergeArgs(7, *[_lse.ctypes.pointer(desc)] * 6, None)
        with self.assertRaises(sagegen.SageArgumentError) as caught:
            _library.check(_lse._merge_entry()(_lse.ctypes.byref(args)))
        self.assertIn("layout: expected SAGE_LAYOUT_HND or SAGE_LAYOUT_NHD, got 7", str(caught.exception))
        args = _lse.MergeArgs(_library.LAYOUT_NHD, *[_lse.ctypes.pointer(desc)] * 5, None, None)
        with self.assertRaises(sagegen.SageArgumentError) as caught:
            _library.check(_lse._merge_entry()(_lse.ctypes.byref(args)))
        self.assertEqual("lse_out: must not be null", str(caught.exception))


class KernelHeadDimTest(unittest.TestCase):
    """sageattn's head-dim rule (_head_dim.py over the library's sage_attention_head_dim): which dim a call runs at."""

    def test_the_sm90_kernels_dims_and_other_archs_keep_their_dim(self):
        from sagegen._head_dim import kernel_head_dim
        for capability in ((8, 0), (8, 9), (9, 0), (12, 0)):
            for dim in (64, 128, 192, 256):
                self.assertEqual(kernel_head_dim(dim, 16384, "sage-b", capability), dim)
        self.assertEqual(kernel_head_dim(96, 16384, "sage-b", (8, 0)), 96)
        self.assertEqual(kernel_head_dim(160, 16384, "sage-b", (8, 0)), 160)
        self.assertEqual(kernel_head_dim(160, 16384, "sage-b", (9, 0)), 192)  # the wgmma kernels' next dim
        self.assertEqual(kernel_head_dim(160, 1024, "sage-b", (9, 0)), 160)  # short: the real d's kernel

    def test_hopper_pads_long_calls_between_64_and_128(self):
        from sagegen._head_dim import kernel_head_dim
        for preset in ("sage-b", "sage2-fp8"):
            self.assertEqual(kernel_head_dim(80, 4096, preset, (9, 0)), 128)
            self.assertEqual(kernel_head_dim(112, 16384, preset, (9, 0)), 128)
            self.assertEqual(kernel_head_dim(48, 4096, preset, (9, 0)), 64)
            self.assertEqual(kernel_head_dim(80, 4095, preset, (9, 0)), 80)  # short: the real d's kernel was faster
        self.assertEqual(kernel_head_dim(32, 16384, "sage-b", (9, 0)), 32)  # measured no faster padded
        self.assertEqual(kernel_head_dim(32, 16384, "sage2-fp8", (9, 0)), 64)
        self.assertEqual(kernel_head_dim(80, 16384, "sage-t", (9, 0)), 80)  # not measured: unchanged
        os.environ["SAGEGEN_SCHEDULE"] = "sm80.mma_sync"  # forced, as the runner reads it
        try:
            self.assertEqual(kernel_head_dim(80, 16384, "sage-b", (9, 0)), 80)
        finally:
            del os.environ["SAGEGEN_SCHEDULE"]
        self.assertEqual(kernel_head_dim(80, 16384, "sage-b", (9, 0), block_mask=True), 80)

    def test_dims_without_a_kernel_are_padded_to_the_next_one(self):
        from sagegen._head_dim import kernel_head_dim
        self.assertEqual(kernel_head_dim(72, 128, "sage-b", (9, 0)), 128)  # PixArt's 72: any length
        self.assertEqual(kernel_head_dim(40, 128, "sage2-fp8", (9, 0)), 64)
        self.assertEqual(kernel_head_dim(72, 128, "sage-b", (8, 0)), 80)
        self.assertEqual(kernel_head_dim(8, 128, "sage-b", (8, 9)), 32)
        self.assertEqual(kernel_head_dim(200, 128, "sage-b", (9, 0)), 256)  # the wgmma kernels' next dim
        self.assertEqual(kernel_head_dim(200, 128, "sage-b", (8, 0)), 208)
        for refused in (36, 100, 264, 0):  # not 16-byte rows, or past 256: the library's refusal, unchanged
            self.assertEqual(kernel_head_dim(refused, 128, "sage-b", (9, 0)), refused)
        self.assertEqual(kernel_head_dim(72, 128, "sage-b", (7, 5)), 72)  # a GPU without kernels: the runner says so
        with self.assertRaises(sagegen.SageArgumentError) as caught:
            kernel_head_dim(72, 128, "sage-b", (0, 5))
        self.assertTrue(str(caught.exception).startswith("capability:"), str(caught.exception))


# Runs in a fresh interpreter: runners that stay cached until exit (as _backward._runners keeps them) are destroyed
# once each, and shutdown prints nothing (a __del__ that looked up module globals printed "Exception ignored").
_RUNNERS_AT_EXIT = """
import sys
sys.path.insert(0, sys.argv[1])
import sagegen
from sagegen import _backward


class FakeLibrary:
    def sage_backward_create(self, config, handle):
        handle._obj.value = 0x1234
        return 0

    def sage_attention_create(self, config, handle):
        handle._obj.value = 0x5678
        return 0

    def sage_backward_destroy(self, handle):
        print("destroyed backward", hex(handle.value), flush=True)

    def sage_attention_destroy(self, handle):
        print("destroyed forward", hex(handle.value), flush=True)


fake = FakeLibrary()
_backward._library = lambda: fake
sagegen.library = lambda: fake
_backward.backward_runner("sagebwd", 64, False, 1, 0)
sagegen._kept_until_exit = sagegen._Runner(sagegen.AttentionConfig())
# A reference nothing releases keeps both modules alive into interpreter shutdown (as a C extension's registry of
# our functions can): then shutdown sets their globals to None before the cached runners go.
import ctypes
for module in (_backward, sagegen):
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(module))
print("exiting", flush=True)
"""


class RunnerLifetimeTest(unittest.TestCase):
    def test_runners_cached_until_exit_are_destroyed_once_and_exit_is_clean(self):
        import subprocess
        package = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
        done = subprocess.run([sys.executable, "-c", _RUNNERS_AT_EXIT, package], capture_output=True, text=True,
                              timeout=60)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stderr, "")
        lines = done.stdout.splitlines()
        self.assertEqual(lines[0], "exiting")
        self.assertEqual(sorted(lines[1:]), ["destroyed backward 0x1234", "destroyed forward 0x5678"])


# The call plans' and the front doors' checks (test_frontdoors.py: a fake torch and library) run here too, so that
# CTest's python_checks_test covers them.
from test_frontdoors import (EagerSageattnTest, FallbackOncePerReasonTest, PlanCacheTest,  # noqa: E402,F401
                             SageAttentionOptionsTest, ShimTest)


if __name__ == "__main__":
    unittest.main()
