"""numba-cuda-mlir support without a GPU (compilers/numba_cuda_mlir.py, docs/compilers.md).

numba-cuda-mlir has no simulator, so its kernels only run in the gpu tests
(tests/test_compilers.py). What needs no GPU is checked here: numbax works,
and never imports it, when it is absent or unused; its kernels are
recognised, accepted and refused with clear errors; the parameter layout
numbax packs is the one numba-cuda-mlir's own lowering gives the kernel;
the launch bridge turns numbax's stream into one its launcher takes and
skips only the synchronisation of the launch's own stream. Several checks
run in a subprocess: to observe imports, or to use the real numba-cuda
classes the simulator replaces.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import numbax
from numbax import _core
from numbax.compilers import numba_cuda_mlir as mlir_compiler
from numbax.compilers import numba_cuda_mlir_launch
from numbax.compilers.cubin import CubinKernel

from conftest import SIMULATOR

ROOT = Path(__file__).resolve().parents[1]
HAVE_MLIR = mlir_compiler.version() is not None
needs_mlir = pytest.mark.skipif(
    not HAVE_MLIR, reason="numba-cuda-mlir is not installed (optional)")


def run_python(code: str, *, simulator: bool, timeout: int = 300):
    env = dict(os.environ)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    env["JAX_PLATFORMS"] = "cpu"
    if simulator:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                          cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


# -- optional: numbax without numba-cuda-mlir ---------------------------------

def test_numbax_works_and_never_imports_it_when_absent():
    # numba_cuda_mlir made unimportable, as on a machine without it: ops of
    # numba-cuda kernels work, the bridge stays off, nothing imports it.
    out = run_python("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "numba_cuda_mlir":
                    raise ImportError("blocked by the test")
        sys.meta_path.insert(0, Block())
        import jax, jax.numpy as jnp, numpy as np
        from numba import cuda
        import numbax
        from numbax.compilers import numba_cuda_mlir as mlir_compiler
        from numbax.compilers import numba_cuda_mlir_launch

        @cuda.jit
        def double(x, out):
            i = cuda.grid(1)
            if i < x.shape[0]:
                out[i] = 2 * x[i]

        op = numbax.numba_cuda_kernel(
            double, jax.ShapeDtypeStruct((8,), jnp.float32), launch_dims=8)
        x = np.arange(8, dtype=np.float32)
        assert np.array_equal(np.asarray(jax.jit(op)(x)), 2 * x)

        def func(x, out, stream):
            double[1, 8, stream](x, out)
        cop = numbax.numba_cuda_callable(
            func, outs=jax.ShapeDtypeStruct((8,), jnp.float32))
        assert np.array_equal(np.asarray(jax.jit(cop)(x)), 2 * x)

        assert not mlir_compiler.COMPILER.owns(double) and not mlir_compiler.COMPILER.owns(func)
        print("bridge:", numba_cuda_mlir_launch.install_launch_bridge(
            mlir_compiler.LAUNCH_NEEDS))
        print("imported:", sorted(m for m in sys.modules
                                  if m.startswith("numba_cuda_mlir")))
    """, simulator=True)
    assert "bridge: off until numba_cuda_mlir is imported" in out
    assert "imported: []" in out


def test_status_says_absent_or_names_the_version(monkeypatch):
    monkeypatch.setattr(mlir_compiler, "version", lambda: None)
    assert mlir_compiler.status().startswith("not installed")
    assert "no simulator" in mlir_compiler.status()
    monkeypatch.setattr(mlir_compiler, "version", lambda: "0.6.0")
    assert mlir_compiler.status().startswith("0.6.0 (")
    monkeypatch.setattr(mlir_compiler, "version", lambda: "0.9.1")
    assert "not verified" in mlir_compiler.status()


def test_info_reports_it():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-m", "numbax", "info"], cwd=ROOT,
                          env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expected = mlir_compiler.version() or "not installed"
    assert re.search(rf"^numba-cuda-mlir\s+{re.escape(expected)}",
                     proc.stdout, re.M), proc.stdout
    # info reads the version from metadata: importing it takes seconds.
    assert "numba_cuda_mlir" not in proc.stderr


# -- its kernels in numbax ----------------------------------------------------

@pytest.fixture(scope="module")
def mlir_cuda():
    if not HAVE_MLIR:
        pytest.skip("numba-cuda-mlir is not installed (optional)")
    from numba_cuda_mlir import cuda
    return cuda


@pytest.fixture(scope="module")
def mlir_kernels(mlir_cuda):
    cuda = mlir_cuda

    @cuda.jit
    def double(x, out):
        i = cuda.grid(1)
        if i < x.shape[0]:
            out[i] = 2 * x[i]

    @cuda.jit(device=True)
    def helper(x):
        return x + 1

    return double, helper


def test_recognised_by_type(mlir_kernels):
    double, helper = mlir_kernels
    assert mlir_compiler.COMPILER.owns(double) and mlir_compiler.COMPILER.owns(helper)
    from numba import cuda

    @cuda.jit
    def numba_kernel(x):
        pass

    for other in (numba_kernel, double.py_func, type(double), None, 3):
        assert not mlir_compiler.COMPILER.owns(other), other


def test_numba_cuda_kernel_accepts_it(mlir_kernels):
    double, _ = mlir_kernels
    op = numbax.numba_cuda_kernel(
        double, jax.ShapeDtypeStruct((8,), jnp.float32), launch_dims=8)
    assert op.compiler is mlir_compiler.COMPILER
    assert "double" in repr(op)
    # Same op for the same arguments (interned), as for numba-cuda kernels.
    assert op is numbax.numba_cuda_kernel(
        double, jax.ShapeDtypeStruct((8,), jnp.float32), launch_dims=8)
    # Same checks: the arity of the kernel against inputs + outputs.
    with pytest.raises(TypeError, match="double"):
        op(jnp.zeros(8), jnp.zeros(8))


def test_device_function_refused(mlir_kernels):
    _, helper = mlir_kernels
    with pytest.raises(TypeError, match="device function"):
        numbax.numba_cuda_kernel(
            helper, jax.ShapeDtypeStruct((8,), jnp.float32), launch_dims=8)


def test_refusal_names_both_compilers():
    with pytest.raises(TypeError,
                       match="@cuda.jit, from numba.cuda or numba_cuda_mlir"):
        numbax.numba_cuda_kernel(
            lambda x: x, jax.ShapeDtypeStruct((8,), jnp.float32),
            launch_dims=8)


@pytest.mark.skipif(not SIMULATOR, reason="the CPU backend's error")
def test_on_the_cpu_it_says_there_is_no_simulator(mlir_kernels):
    double, _ = mlir_kernels
    op = numbax.numba_cuda_kernel(
        double, jax.ShapeDtypeStruct((8,), jnp.float32), launch_dims=8)
    with pytest.raises(NotImplementedError,
                       match=r"numba_cuda_kernel\(\S*double\).*no CPU simulator"
                             r".*run the op on a GPU"):
        jax.jit(op)(jnp.zeros(8, jnp.float32))


def test_argument_types_are_its_own_c_arrays(mlir_kernels):
    from numba_cuda_mlir.numba_cuda import types
    tys = mlir_compiler.COMPILER.argtypes([((4, 3), np.float32), ((5,), np.int64)], 0, (), 'op')
    assert tys == (types.Array(types.float32, 2, "C"),
                   types.Array(types.int64, 1, "C"))
    # vmapped: the batch axis is not the kernel's
    assert mlir_compiler.COMPILER.argtypes([((7, 4, 3), np.float64)], 7, (), 'op') == (
        types.Array(types.float64, 2, "C"),)


def test_def_kernel_refuses_a_bare_kernel(mlir_kernels):
    double, _ = mlir_kernels
    op = numbax.XLACustomKernel("test_mlir_bare")
    with pytest.raises(TypeError, match="not a generator.*numba_cuda_kernel"):
        op.def_kernel("gpu", double, backend="numba_cuda_mlir")
    # A generator returning an op of the kernel is what it takes.
    op.def_kernel("gpu", lambda *, outs: numbax.numba_cuda_kernel(
        double, outs, launch_dims=outs.shape[0]), backend="numba_cuda_mlir")


# -- the parameter layout, checked against numba-cuda-mlir's own lowering ----

# Runs numba-cuda-mlir's front end and MLIR pipeline on the CPU: its
# compiler asks the GPU and CUDA toolkit for the target, which this machine
# has not, so sm_90 is pinned (no PTX is produced). `lower(kernel, sig)`
# returns the parameter types of the kernel's llvm.func.
_LOWER = """
import sys
try:
    from numba_cuda_mlir import cuda, tools, mlir_lowering
    from numba_cuda_mlir.compiler import _compile_only
    from numba_cuda_mlir.descriptor import mlir_target
    from numba_cuda_mlir.lowering_utilities import context
    from numba_cuda_mlir.mlir_optimization import get_base_pipeline
    from numba_cuda_mlir._mlir.passmanager import PassManager
    from numba_cuda_mlir.numba_cuda import types
except ImportError as exc:
    print("SKIP internals moved:", exc); sys.exit(0)
tools._cached_cc = (9, 0)
tools.get_max_ptx_version = lambda: None
mlir_lowering.get_max_ptx_version = lambda: None
mlir_target.ensure_initialized()

def lower_text(kernel, sig):
    # The pipeline numba-cuda-mlir's optimize() runs first; it keeps the
    # result as metadata["mlir_module_optimized"], which numbax reads.
    cres = _compile_only(kernel, sig)
    with context.get_context():
        module = cres.metadata["mlir_module"]
        PassManager.parse(get_base_pipeline()).run(module.operation)
        return str(module)

def lower(kernel, sig):
    text = lower_text(kernel, sig)
    (line,) = [line for line in text.splitlines()
               if "llvm.func" in line and "gpu.kernel" in line]
    params = line[line.index("(") + 1:line.index(")")]
    return [p.split(":")[1].strip() for p in params.split(",")]
"""


@needs_mlir
def test_packed_words_match_the_lowered_kernel_signature():
    # numba-cuda-mlir lowers a kernel through MLIR to an llvm.func whose
    # parameters are what cuLaunchKernel must be given. Its compiler asks the
    # GPU and CUDA toolkit for the target, which this CPU machine has not:
    # the subprocess pins sm_90 to run the frontend and MLIR pipeline only
    # (no PTX). Then every array's parameters are compared with the words
    # numbax packs (csrc/kernel_args.cc, memref ABI).
    out = run_python(_LOWER + textwrap.dedent("""
        @cuda.jit
        def kernel(a, b, c, out):
            i = cuda.grid(1)
            if i < out.shape[0]:
                out[i] = a[i] + b[i, 0] + c[0, 0, i]

        ranks = (1, 2, 3, 1)
        sig = tuple(types.Array(types.float32, r, "C") for r in ranks)
        print("PARAMS", " ".join(lower(kernel, sig)))
    """), simulator=False)
    if out.startswith("SKIP"):
        pytest.skip(out)
    params = out.split("PARAMS", 1)[1].split()
    ranks, address = (1, 2, 3, 1), 0x7F0000100000
    expected_kinds, words = [], []
    for rank in ranks:
        shape = [3 + rank] * rank
        packed = _core.pack_array_for_test(mlir_compiler.COMPILER.abi, address, shape, 4)
        words.append(packed)
        # allocated and aligned pointers, then offset, sizes, strides: i64
        expected_kinds += ["!llvm.ptr", "!llvm.ptr"] + ["i64"] * (1 + 2 * rank)
        assert packed[:3] == [address, address, 0]
        assert packed[3:3 + rank] == shape
        # C-contiguous strides in elements, innermost 1
        assert packed[3 + rank:][-1] == 1
    assert params == expected_kinds
    assert sum(map(len, words)) == len(params)
    # Numba's layout would put 2 extra words per array: the kernel would
    # read shapes as pointers.
    numba_words = _core.pack_array_for_test(0, address, [5], 4)
    assert len(numba_words) == len(words[0]) + 2


def test_pack_array_for_test_refuses_an_unknown_abi():
    with pytest.raises(ValueError, match="abi"):
        _core.pack_array_for_test(7, 0, [1], 4)


# -- numbax's stream in numba-cuda-mlir launches (the launch bridge) ---------

@needs_mlir
def test_launch_bridge_takes_numbax_stream_and_keeps_foreign_syncs():
    # Outside the simulator: numbax's stream is a real numba-cuda Stream,
    # which the simulator replaces. Nothing here reaches a GPU: configure
    # builds the launcher without one, and the sync is observed before it
    # would need the driver.
    out = run_python("""
        import numbax
        from numbax.compilers import numba_cuda_mlir, numba_cuda_mlir_launch
        from numba.cuda.cudadrv import driver as numba_driver
        from numba_cuda_mlir import cuda, descriptor

        @cuda.jit
        def fill(x):
            i = cuda.grid(1)
            if i < x.shape[0]:
                x[i] = 1

        numbax_stream = object.__new__(numba_driver.Stream)
        numbax_stream.handle, numbax_stream.external = 0x1234, True
        try:
            fill[128, 32, numbax_stream]
            print("before: accepted")
        except TypeError as exc:
            print("before: refused:", exc)

        print("bridge:", numba_cuda_mlir_launch.install_launch_bridge(
            numba_cuda_mlir.LAUNCH_NEEDS))
        launcher = fill[128, 32, numbax_stream]
        print("launch stream:", hex(launcher._launch_stream))

        class Array:  # a device array whose interface names `stream`
            def __init__(self, stream):
                self.__cuda_array_interface__ = {
                    "shape": (4,), "typestr": "<f4", "data": (0x10000, False),
                    "version": 3, "strides": None, "stream": stream}

        sync = descriptor._sync_cuda_array_interface_stream
        numba_cuda_mlir_launch._launching.stream = 0x1234
        sync(Array(0x1234))  # the launch's own stream: no sync
        print("same stream: skipped")
        try:
            sync(Array(0x5678))  # another stream: numba-cuda-mlir syncs it
            print("other stream: skipped")
        except Exception as exc:  # no driver here: the sync was attempted
            print("other stream: synced (", type(exc).__name__, ")")
    """, simulator=False)
    assert "before: refused: Unsupported stream type" in out, out
    assert "bridge: on (numba-cuda-mlir 0.6" in out, out
    assert "launch stream: 0x1234" in out, out
    assert "same stream: skipped" in out, out
    assert "other stream: synced" in out, out


def test_same_stream_rule():
    class A:
        def __init__(self, stream):
            self.__cuda_array_interface__ = {"stream": stream}

    assert numba_cuda_mlir_launch._same_stream(A(0x99), 0x99)
    assert not numba_cuda_mlir_launch._same_stream(A(0x99), 0x98)
    assert not numba_cuda_mlir_launch._same_stream(A(None), 0x99)
    # 1 and 2 are the default streams' aliases: never assumed the same
    assert not numba_cuda_mlir_launch._same_stream(A(1), 1)
    assert not numba_cuda_mlir_launch._same_stream(A(0x99), None)
    assert not numba_cuda_mlir_launch._same_stream(object(), 0x99)


# -- the fast path's memref packing, without a GPU ----------------------------
# numbax's C++ launch hook on a stand-in launcher, in a dry run (it records
# what it would send to cuLaunchKernel): a plan whose arrays are packed 'M'
# (numba-cuda-mlir's memrefs) replays with memref words, as _fast_plan
# builds them for numba-cuda-mlir's launcher.

class _Ptr:
    def __init__(self, value):
        self.value = value


class _DeviceArray:
    """What numbax's hook reads from a device array."""

    def __init__(self, ptr, shape, strides, dtype=np.dtype(np.float32)):
        self.ptr, self.shape, self.strides, self.dtype = ptr, shape, strides, dtype
        self.ndim = len(shape)

    @property
    def device_ctypes_pointer(self):
        return _Ptr(self.ptr)


STREAM = 0x7000


@pytest.fixture
def dry_hook():
    from numbax.compilers import numba_cuda_launch
    _core.clear_launch_plans()
    _core.set_fast_launch_dry_run(True)
    numbax.reset_bridge_counters()
    state = {"launched": [], "packing": None}

    class Launcher:  # stands in for numba-cuda-mlir's _ArgMarshaller
        _launch_stream = STREAM

        def __call__(self, *args):
            state["launched"].append(args)

    def check(cfg, args, ours, device):
        for value, slot in zip(args, ours):
            if (slot == numba_cuda_launch.OTHER
                    and type(value) not in numba_cuda_mlir_launch._SCALARS):
                return ("foreign_argument", True,
                        numba_cuda_mlir_launch._marshaller_stream(cfg))
        return None, True, numba_cuda_mlir_launch._marshaller_stream(cfg)

    def plan(cfg, args, ours, device):
        return (0xBEEF, (3, 1, 1), (64, 1, 1), 0, False, state["packing"],
                object(), {"sig": 1}, [])

    Launcher.__call__ = _core.make_launch_hook(
        Launcher.__dict__["__call__"], check, plan)
    a = _DeviceArray(0x10000, (8,), (4,))
    b = _DeviceArray(0x20000, (4, 3), (12, 4))
    buffers = [(0x10000, "float32", (8,)), (0x20000, "float32", (4, 3))]

    def run(func):
        return _core.call_as_numbax(func, (a, b), buffers, STREAM, 0, True)

    yield Launcher, a, b, run, state
    _core.set_fast_launch_dry_run(False)
    _core.clear_launch_plans()


def test_fast_path_packs_memrefs(dry_hook):
    Launcher, a, b, run, state = dry_hook
    cfg = Launcher()
    state["packing"] = "MMid"
    launch = lambda: cfg(a, b, 7, 0.5)  # noqa: E731
    run(launch)  # the first launch is the compiler's own
    assert len(state["launched"]) == 1
    run(launch)
    assert len(state["launched"]) == 1
    counters = numbax.bridge_counters()
    assert counters["fast_launches"] == 1, counters
    last = _core.last_fast_launch()
    assert last["function"] == 0xBEEF and last["stream"] == STREAM
    f64 = int(np.array([0.5], np.float64).view(np.int64)[0])
    assert last["words"] == [
        0x10000, 0x10000, 0, 8, 1,              # a: memref, stride 1 element
        0x20000, 0x20000, 0, 4, 3, 3, 1,        # b: sizes, strides in elements
        7, f64]


def test_fast_path_never_mixes_the_two_layouts(dry_hook):
    # A plan packing one array each way is malformed: the launch stays the
    # compiler's, counted as numbax's plan error.
    Launcher, a, b, run, state = dry_hook
    cfg = Launcher()
    state["packing"] = "AM"
    for _ in range(3):
        run(lambda: cfg(a, b))
    assert len(state["launched"]) == 3
    counters = numbax.bridge_counters()
    assert counters["fast_launches"] == 0
    assert counters["fallback_plan_error"] == 3, counters


class _Planners:
    has_planners = False


class _Dispatcher:
    targetoptions = {"debug": False}
    _requires_launch_config = False
    _literal_arg_positions = frozenset()


class _Marshaller:
    def __init__(self, **overrides):
        self._dispatcher = _Dispatcher()
        self._extensions = []
        self._launch_config = None
        self._available_launch_config = {"grid": (1, 1, 1),
                                          "block": (32, 1, 1),
                                          "sharedmem": None, "cluster": None}
        self._launch_stream = STREAM
        self.__dict__.update(overrides)


@needs_mlir
def test_fast_check_refuses_what_it_does_not_replay(mlir_cuda):
    ok = _Marshaller()
    assert numba_cuda_mlir_launch._fast_check(ok, (1, 2.0), (0, -1), 0) == (None, True, STREAM)
    # A view of a buffer (its layout is numba-cuda's computation), a host
    # array, a bool (its parameter width is the compiler's choice).
    assert numba_cuda_mlir_launch._fast_check(ok, (1,), (-2,), 0)[0] == "foreign_argument"
    assert numba_cuda_mlir_launch._fast_check(ok, (np.zeros(2),), (-1,), 0)[0] == \
        "foreign_argument"
    assert numba_cuda_mlir_launch._fast_check(ok, (True,), (-1,), 0)[0] == "foreign_argument"
    debug = _Marshaller()
    debug._dispatcher.targetoptions = {"debug": True}
    for cfg in (_Marshaller(_extensions=[object()]),
                _Marshaller(_launch_config={"grid": (1, 1, 1)}),
                _Marshaller(_available_launch_config={
                    "grid": (1, 1, 1), "block": (1, 1, 1), "sharedmem": None,
                    "cluster": (2, 1, 1)}),
                debug):
        assert numba_cuda_mlir_launch._fast_check(cfg, (), (), 0)[0] == "unsupported_kernel"
    # Its own stream objects are read through their handle.
    class Stream:
        handle = 0x4242
    assert numba_cuda_mlir_launch._marshaller_stream(_Marshaller(_launch_stream=Stream())) \
        == 0x4242


def test_bench_has_its_rows_and_skips_them_without_a_gpu():
    from numbax.bench import impls, run
    rows = {i.name: i for i in impls.all_impls(impls.Env(on_gpu=False))}
    for name in ("numbax_kernel_mlir", "numbax_callable_mlir"):
        assert name in run.NAMES
        with pytest.raises(impls.Unavailable) as info:
            rows[name].make(16)
        assert info.value.status == "skipped"


def test_a_dtype_it_cannot_type_names_the_op(mlir_kernels):
    with pytest.raises(TypeError, match=r"my_op: numba-cuda-mlir has no type "
                                        r"for dtype \|V8.*cast the array"):
        mlir_compiler.COMPILER.argtypes([((3,), np.dtype("V8"))], 0, (), "my_op")


@pytest.mark.parametrize("options, message", [
    ({"debug": True, "opt": False},
     "kernels compiled with debug=True report errors through numba-cuda-mlir's "
     "own launcher; launch them from a numba_cuda_callable"),
    ({"lto": True},
     "the numba-cuda-mlir kernel is compiled with lto=True .*numba_cuda_kernel "
     "loads cubins"),
])
def test_kernels_it_cannot_load_are_refused_before_compiling(
        mlir_cuda, options, message):
    # Refused from the kernel's options alone: no compile (and no GPU).
    @mlir_cuda.jit(**options)
    def kernel(x, out):
        i = mlir_cuda.grid(1)
        if i < x.shape[0]:
            out[i] = x[i]

    op = numbax.numba_cuda_kernel(
        kernel, jax.ShapeDtypeStruct((8,), jnp.float32), launch_dims=8)
    tys = mlir_compiler.COMPILER.argtypes([((8,), np.float32)] * 2, 0, (), 'op')
    with pytest.raises(ValueError, match=r"numba_cuda_kernel\(\S*kernel\): "
                                         + message):
        mlir_compiler.COMPILER.compile(kernel, tys, op.label)


@needs_mlir
def test_the_gpu_tests_kernels_pass_its_front_end():
    # tests/test_compilers.py runs only on a GPU: here its kernels, as
    # numba-cuda-mlir compiles them, are typed and lowered on the CPU for
    # the argument types numbax gives them, and each lowered signature has
    # 3 + 2*rank parameters per array, the words numbax packs.
    out = run_python(_LOWER + textwrap.dedent("""
        import numpy as np
        import two_compilers
        from numbax.compilers import numba_cuda_mlir as mlir_compiler
        k = two_compilers.load("numba_cuda_mlir")
        f32 = np.dtype(np.float32)
        calls = {
            "affine": [((9,), f32)] * 2,
            "add": [((9,), f32)] * 3,
            "scale_rows": [((4, 5), f32), ((5,), f32), ((4, 5), f32)],
            "box3": [((2, 3, 4), f32)] * 2,
            "sum_and_diff": [((9,), f32)] * 4,
            "scale_in_place": [((9,), f32)] * 2,
        }
        for dtype in (np.float64, np.int32, np.int64):  # test_kernel_elementwise
            calls[f"affine:{np.dtype(dtype)}"] = [((9,), np.dtype(dtype))] * 2
        for name, avals in calls.items():
            kernel = getattr(k, name.split(":")[0])
            params = lower(kernel, mlir_compiler.COMPILER.argtypes(avals, 0, (), 'op'))
            want = sum(3 + 2 * len(shape) for shape, _ in avals)
            print(name, len(params), want)
        from numbax.bench import kernels_mlir  # the bench rows' kernel
        params = lower(kernels_mlir.affine, mlir_compiler.COMPILER.argtypes(
            [((9,), f32)] * 2, 0, (), 'op'))
        print("bench.affine", len(params), 10)
    """), simulator=False)
    if out.startswith("SKIP"):
        pytest.skip(out)
    rows = [line.split() for line in out.splitlines() if line.strip()]
    assert len(rows) == 10, out
    for name, got, want in rows:
        assert got == want, f"{name}: {got} parameters, numbax packs {want}"


def test_one_library_per_compiled_kernel_loaded_once(monkeypatch):
    # Every trace and program of one compiled kernel shares one CUDA library,
    # loaded on first use; a load error names the driver call.
    pytest.importorskip("cuda.bindings")
    from cuda.bindings import driver
    loads, lookups = [], []

    class Result:
        pass

    def load(code, *options):
        loads.append((code, options))
        return driver.CUresult.CUDA_SUCCESS, "library"

    def get_kernel(library, name):
        lookups.append((library, name))
        return driver.CUresult.CUDA_SUCCESS, 0xC0DE

    monkeypatch.setattr(driver, "cuLibraryLoadData", load)
    monkeypatch.setattr(driver, "cuLibraryGetKernel", get_kernel)
    result = Result()
    first = mlir_compiler.loadable(result, b"cubin", "_Z6kernel", (9, 0))
    assert mlir_compiler.loadable(result, b"cubin", "_Z6kernel", (9, 0)) is first
    assert first.kernel_handle() == 0xC0DE == first.kernel_handle()
    assert loads == [(b"cubin", (None, None, 0, None, None, 0))]
    assert lookups == [("library", b"_Z6kernel")]

    monkeypatch.setattr(driver, "cuLibraryLoadData", lambda *a: (
        driver.CUresult.CUDA_ERROR_INVALID_IMAGE, None))
    monkeypatch.setattr(driver, "cuGetErrorName", lambda err: (
        driver.CUresult.CUDA_SUCCESS, b"CUDA_ERROR_INVALID_IMAGE"))
    other = mlir_compiler.loadable(Result(), b"bad", "_Z1k", (9, 0))
    with pytest.raises(RuntimeError,
                       match="cuLibraryLoadData failed: CUDA_ERROR_INVALID_IMAGE"):
        other.kernel_handle()


# -- vmap in one launch: what numba-cuda-mlir's MLIR reads --------------------

def test_axes_read_by_mlir_rule():
    read = mlir_compiler.axes_read_by_mlir
    assert read("%0 = nvvm.read.ptx.sreg.ctaid.x : i32") == (frozenset({0}), None)
    assert read("nvvm.read.ptx.sreg.ctaid.x nvvm.read.ptx.sreg.nctaid.z")[0] \
        == frozenset({0, 2})
    assert read("%1 = gpu.block_id  y")[0] == frozenset({1})
    # Clusters index blocks too: every axis.
    assert read("nvvm.read.ptx.sreg.clusterid.x")[0] == frozenset({0, 1, 2})
    # Inline PTX reading %ctaid.z.
    assert read('llvm.inline_asm "mov.u32 $0, %ctaid.z;"')[0] == frozenset({2})
    # libdevice and intrinsics are known; other declared code is not.
    text = ("llvm.func @__nv_sinf(f32) -> f32\n"
            "llvm.func @llvm.nvvm.barrier0()\n"
            "llvm.func @kernel(%arg0: !llvm.ptr) attributes {gpu.kernel} {\n")
    assert read(text) == (frozenset(), None)
    axes, why = read(text + "llvm.func @my_extern(i32) -> i32\n")
    assert axes is None and "my_extern" in why


@needs_mlir
def test_batched_kernel_builds_and_reads_as_the_rule_says():
    # Lowered on the CPU (_LOWER): which axes each kernel reads, and the
    # generated batched kernel (slice = blockIdx.z) around a numba-cuda-mlir
    # kernel: it compiles, takes rank+1 memrefs, and reads z itself.
    out = run_python(_LOWER + textwrap.dedent("""
        import numpy as np
        import two_compilers
        from numbax.compilers import numba_cuda_mlir as mlir_compiler
        k = two_compilers.load("numba_cuda_mlir")
        f32 = np.dtype(np.float32)
        one = mlir_compiler.COMPILER.argtypes([((9,), f32)] * 3, 0, (), 'op')
        axes, why = mlir_compiler.axes_read_by_mlir(lower_text(k.add, one))
        print("add", sorted(axes), why)
        three = mlir_compiler.COMPILER.argtypes([((2, 3, 4), f32)] * 2, 0, (), 'op')
        axes, why = mlir_compiler.axes_read_by_mlir(lower_text(k.box3, three))
        print("box3", sorted(axes), why)
        batched = mlir_compiler.COMPILER.batched_kernel(k.add, 3, (False, True), 2,
                                                None, ())
        sig = mlir_compiler.COMPILER.argtypes([((5, 9), f32)] * 3, 0, (), 'op')
        text = lower_text(batched, sig)
        axes, why = mlir_compiler.axes_read_by_mlir(text)
        (line,) = [l for l in text.splitlines()
                   if "llvm.func" in l and "gpu.kernel" in l]
        print("batched", sorted(axes), why, line.count("%arg"))
    """), simulator=False)
    if out.startswith("SKIP"):
        pytest.skip(out)
    assert "add [0] None" in out, out
    assert "box3 [0, 1, 2] None" in out, out
    # 3 arrays of rank 2: 3 * (3 + 2*2) parameters
    assert "batched [0, 2] None 21" in out, out


def test_vmap_fold_decision_reads_the_compiled_module(mlir_kernels,
                                                      monkeypatch):
    # The op's vmap decision for a numba-cuda-mlir kernel comes from the
    # compiled module's reads (compile stubbed: it needs a GPU).
    double, _ = mlir_kernels
    texts = iter(["nvvm.read.ptx.sreg.ctaid.x nvvm.read.ptx.sreg.ntid.x",
                  "nvvm.read.ptx.sreg.ctaid.x nvvm.read.ptx.sreg.ctaid.z "
                  "nvvm.read.ptx.sreg.nctaid.y"])

    class Result:
        def __init__(self):
            self.metadata = {"mlir_module_optimized": next(texts)}

    monkeypatch.setattr(mlir_compiler, "_compile", lambda kernel, tys, label:
                        CubinKernel(b"", "k", (9, 0), Result()))
    spec = jax.ShapeDtypeStruct((300,), jnp.float32)
    folds = numbax.numba_cuda_kernel(double, spec, launch_dims=300,
                                     vmap_method="expand_dims")
    decision = folds.vmap_fold(spec)
    assert decision.folds and decision.axis == "z", decision
    per_slice = numbax.numba_cuda_kernel(double, spec, launch_dims=300,
                                         vmap_method="broadcast_all")
    decision = per_slice.vmap_fold(spec)
    assert not decision.folds and "reads grid axis z/y" in decision.reason, \
        decision


@needs_mlir
def test_configure_answers_repeats_with_what_numba_cuda_mlir_would_return():
    # numbax answers `kernel[grid, block, stream]` repeats before
    # numba-cuda-mlir's configure (about 9 us of Python): always the launcher
    # its own configure returns for the same arguments, also after its cache
    # was cleared or the dispatcher gained an extension.
    out = run_python("""
        import warnings
        warnings.simplefilter("ignore")
        from numba_cuda_mlir import cuda
        import numbax.compilers.numba_cuda_mlir_launch as m
        from numbax.compilers.numba_cuda_mlir import LAUNCH_NEEDS

        @cuda.jit
        def k(x, y):
            i = cuda.grid(1)

        own = type(k).configure
        assert m.install_launch_bridge(LAUNCH_NEEDS).startswith("on")
        assert type(k).configure is not own
        a = k[16, 256, 0]
        assert k[16, 256, 0] is a and own(k, 16, 256, 0) is a
        assert k[(16, 1, 1), 256, 0] is own(k, (16, 1, 1), 256, 0)
        assert k[16, 128, 0] is not a
        k._clear_configure_cache()
        b = k[16, 256, 0]
        assert b is not a and k[16, 256, 0] is b and own(k, 16, 256, 0) is b

        class Extension:
            def prepare_args(self, ty, val, **kwargs):
                return ty, val

        k.extensions.append(Extension())
        c = k[16, 256, 0]
        assert c is not b and own(k, 16, 256, 0) is c
        k.extensions.clear()
        assert k[16, 256, 0] is own(k, 16, 256, 0)
        # Unhashable arguments go to numba-cuda-mlir's configure as given.
        assert k[[16], [256], 0] is own(k, [16], [256], 0)
        print("ok")
    """, simulator=False)
    assert out.strip().endswith("ok")
