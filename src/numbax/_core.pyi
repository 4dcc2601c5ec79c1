"""numbax's C++ core: XLA FFI handlers and the CUDA driver bridge"""

from collections.abc import Callable, Sequence


def callable_handlers() -> dict: ...

def kernel_handlers() -> dict: ...

def call_site_types() -> dict: ...

def kernel_site_type() -> dict: ...

def cpu_kernel_handlers() -> dict: ...

def cpu_kernel_site_type() -> dict: ...

def set_cpu_kernel_resolver(arg: object, /) -> None:
    """Sets the function that resolves numba_kernel keys at instantiate."""

class LoadedKernel:
    """
    A numba_cuda_kernel call's kernel, loaded on every visible device (a CUfunction per device ordinal), with what one launch needs: built by numbax at XLA's instantiate stage and read by the C++ handler on every call. Keyword arguments only.
    """

    def __init__(self, *, owner: object, functions: Sequence[int], num_inputs: int, num_outputs: int, grid: Sequence[int], block: Sequence[int], shared_mem: int, cooperative: bool, empty_launch: bool, batch: int, broadcast: Sequence[bool], fold_axis: int, max_slices: int, abi: int, aliases: Sequence[tuple[int, int]], scalars: Sequence[tuple[int, str, bytes]], lead_units: Sequence[int], trail_units: Sequence[int], grid_from: Sequence[int], name: str = '') -> None: ...

    @property
    def owner(self) -> object: ...

    @property
    def functions(self) -> list[int]: ...

    @property
    def num_inputs(self) -> int: ...

    @property
    def num_outputs(self) -> int: ...

    @property
    def grid(self) -> tuple: ...

    @property
    def block(self) -> tuple: ...

    @property
    def shared_mem(self) -> int: ...

    @property
    def cooperative(self) -> bool: ...

    @property
    def empty_launch(self) -> bool: ...

    @property
    def batch(self) -> int: ...

    @property
    def broadcast(self) -> list[bool]: ...

    @property
    def fold_axis(self) -> int: ...

    @property
    def max_slices(self) -> int: ...

    @property
    def abi(self) -> int: ...

    @property
    def aliases(self) -> list[tuple[int, int]]: ...

    @property
    def lead_units(self) -> list[int]: ...

    @property
    def trail_units(self) -> list[int]: ...

    @property
    def grid_from(self) -> tuple: ...

    @property
    def scalars(self) -> list[tuple[int, list[int]]]:
        """(position, words) of each scalar parameter, as C++ packs it."""

    @property
    def name(self) -> str: ...

def nvtx_attached() -> bool:
    """
    Whether an NVTX tool (named by NVTX_INJECTION64_PATH) attached when numbax was imported: each op's calls are then NVTX ranges named after the op.
    """

def set_python_hooks(resolve: object, device_array: object, host_array: object, device_stream: object, host_stream: object, format_exception: object) -> None: ...

def set_call_guard(pairs: object | None) -> None:
    """Thread-local state swapped in around every call of a func."""

def prepare_for_exit(timeout_s: float = 5.0) -> int:
    """
    Refuses Python in handlers from now on and waits for the calls in flight; registered with atexit by numbax.
    """

def set_kernel_resolver(resolver: object) -> None: ...

def kernel_function(kernel: int, ordinal: int, shared_mem: int = 0) -> int: ...

def call_on_device(ordinal: int, fn: Callable) -> object: ...

def counters() -> dict:
    """Bridge cache and call counters."""

def reset_counters() -> None: ...

def make_launch_hook(original: object, check: object, plan: object, cached: object | None = None) -> object:
    """The object numbax sets as Numba's _LaunchConfiguration.__call__."""

def make_configure_hook(original: object, configure: object, cls: object) -> object:
    """The object numbax sets as Numba's CUDADispatcher.__getitem__."""

def note_simulator_launch() -> bool:
    """Counts a simulator launch made inside a numbax call."""

def note_device_to_host() -> bool:
    """
    Notes a device-to-host copy made on this thread: true when a capture-mode recording runs here (the call site is then never captured).
    """

def numba_layout(shape: Sequence[int], strides: Sequence[int], itemsize: int) -> str:
    """
    The Numba layout the fast launch path computes for a view ('' where it leaves the launch to Numba); for tests.
    """

def pack_array_for_test(abi: int, address: int, shape: Sequence[int], itemsize: int) -> list[int]:
    """
    The parameter words numba_cuda_kernel packs for one C-contiguous array in `abi` (LoadedKernel.abi); for tests.
    """

def pack_scalar(how: str, value: object) -> object:
    """The words the fast launch path packs for a scalar; for tests."""

def set_fast_launch_dry_run(on: bool) -> None:
    """Tests only: fast launches record what they would launch instead."""

def last_fast_launch() -> object: ...

def call_as_numbax(func: object, arrays: object, buffers: object, stream: int, device: int = 0, enabled: bool = True, cached_plans: bool = True) -> object:
    """
    Tests only: runs func() as numbax runs a func, with `arrays` over `buffers` ((address, dtype, shape) each) on `stream`; cached_plans=False as a capture-mode call does.
    """

def time_driver_launches(function: int, grid: Sequence[int], block: Sequence[int], words: Sequence[int], stream: int, count: int, mode: int) -> float:
    """
    Benchmarks: host seconds of `count` back-to-back cuLaunchKernel calls (mode 0 GIL held, 1 GIL released per launch, 2 one parameter buffer); -CUresult if one failed.
    """

def set_fast_launch_resolves_function(on: bool) -> None:
    """
    Benchmarks: plans recorded from now on launch each kernel's CUfunction in the bound context (True, the default) or Numba's CUkernel handle.
    """

def set_bridge_stop(stop: int) -> None:
    """
    Benchmarks: plain callables' calls return after stage `stop` without calling func (0, the default: the whole call; 1 the call frame decoded; 2 the GIL taken; 3 func's arrays found; 4 the guard entered and left).
    """

def clear_launch_plans() -> None: ...

def launch_plan_count() -> int: ...

def launch_plan_functions() -> list[int]:
    """Tests: the handle each launchable plan passes to cuLaunchKernel."""

def set_graph_cache_size(arg: int, /) -> None: ...

def graph_cache_size() -> int: ...

def clear_graph_caches() -> None: ...

def rebind_refusals() -> list[tuple[str, str]]:
    """
    (op key, why) of capture-mode call sites found not re-bindable, the most recent last (at most 64).
    """

def clear_stream_cache() -> None: ...

def driver_status() -> str:
    """'ok' when the CUDA driver loaded, else why it did not."""
