"""numbax._core.LoadedKernel: what kernel/loaded.py hands C++ to launch from.

It is built by keyword only, so kernel/loaded.py and csrc/loaded_kernel.h
cannot drift apart silently: a missing, extra or positional field fails at
construction, and so does a value no launch can take. (The handler that
reads it runs on a GPU: tests/test_kernel.py covers it there.)
"""
import pytest

from numbax import _core


def _fields(**overrides):
    fields = dict(owner=object(), functions=[11, 22], num_inputs=2,
                  num_outputs=1, grid=(3, 2, 1), block=(128, 1, 1),
                  shared_mem=4096, cooperative=True, empty_launch=False,
                  batch=5, broadcast=[False, True], fold_axis=1,
                  max_slices=65535, abi=0, aliases=[(1, 0)], scalars=[],
                  lead_units=[2, 0, 2], trail_units=[1, 0, 0],
                  grid_from=[1, -1, -1])
    fields.update(overrides)
    return fields


def test_fields_read_back_as_given():
    fields = _fields()
    loaded = _core.LoadedKernel(**fields)
    assert loaded.owner is fields["owner"]
    assert loaded.functions == [11, 22]
    assert (loaded.num_inputs, loaded.num_outputs) == (2, 1)
    assert loaded.grid == (3, 2, 1)
    assert loaded.block == (128, 1, 1)
    assert loaded.shared_mem == 4096
    assert loaded.cooperative is True
    assert loaded.empty_launch is False
    assert loaded.batch == 5
    assert loaded.broadcast == [False, True]
    assert loaded.fold_axis == 1
    assert loaded.max_slices == 65535
    assert loaded.abi == 0
    assert loaded.aliases == [(1, 0)]
    assert loaded.scalars == []
    # a call XLA splits (src/numbax/trace/sharding_rules.py): unit axes per
    # buffer, and the grid axes read from output 0's local extents
    assert loaded.lead_units == [2, 0, 2]
    assert loaded.trail_units == [1, 0, 0]
    assert loaded.grid_from == (1, -1, -1)
    none = _core.LoadedKernel(**_fields(lead_units=[], trail_units=[]))
    assert (none.lead_units, none.trail_units) == ([], [])
    # scalars are not buffers: the unit axes still count the 3 buffers
    both = _core.LoadedKernel(**_fields(scalars=[(1, "i", b"1234")]))
    assert both.lead_units == [2, 0, 2]
    assert [p for p, _ in both.scalars] == [1]
    # numba-cuda-mlir kernels: arrays packed as MLIR memrefs (kernel_args.h)
    assert _core.LoadedKernel(**_fields(abi=1)).abi == 1


def test_every_field_is_required():
    for name in _fields():
        fields = _fields()
        del fields[name]
        with pytest.raises(TypeError):
            _core.LoadedKernel(**fields)


def test_unknown_field_and_positional_arguments_fail():
    with pytest.raises(TypeError):
        _core.LoadedKernel(**_fields(), grid_x=3)
    with pytest.raises(TypeError):
        _core.LoadedKernel(*_fields().values())


@pytest.mark.parametrize("name, value, message", [
    ("fold_axis", 0, "fold_axis must be -1, 1 or 2"),
    ("fold_axis", 3, "fold_axis must be -1, 1 or 2"),
    ("max_slices", 0, "max_slices must be >= 1"),
    ("grid", (1, 2), "grid and block must be 3-tuples"),
    ("grid", (1, 1, 2**32), "grid and block must be 3-tuples"),
    ("block", (-1, 1, 1), "grid and block must be 3-tuples"),
    ("broadcast", [True], "broadcast needs one flag per input"),
    ("batch", -1, "negative launch parameter"),
    ("shared_mem", -1, "negative launch parameter"),
    ("num_outputs", -1, "negative launch parameter"),
    ("shared_mem", 2**32, "shared_mem does not fit in 32 bits"),
    ("abi", 2, "abi must be 0 .numba-cuda. or 1"),
    ("abi", -1, "abi must be 0 .numba-cuda. or 1"),
    # input_output_aliases the C++ copy would act on (csrc/aliases.h)
    ("aliases", [(2, 0)], "alias input index 2 is not one of the 2 inputs"),
    ("aliases", [(0, 1)], "alias output index 1 is not one of the 1 outputs"),
    ("aliases", [(0, 0), (1, 0)], "two inputs alias output 0"),
    ("lead_units", [1, 1], "need one count per buffer"),
    ("trail_units", [0, 0, 0, 0], "need one count per buffer"),
    ("lead_units", [0, -1, 0], "unit axes out of range"),
    ("grid_from", [0, 0], "grid_from must have 3 entries"),
    ("grid_from", [-2, -1, -1], "grid_from entries must be -1 or an axis"),
    # scalars passed by value (csrc/kernel_args.h, MakeScalarParam)
    ("scalars", [(0, "x", b"1234")], "unknown scalar kind 'x'"),
    ("scalars", [(0, "ff", b"1234")], "kind must be one character"),
    ("scalars", [(0, "i", b"123")], "integer scalar takes 1, 2, 4 or 8"),
    ("scalars", [(0, "f", b"1")], "float scalar takes 2, 4 or 8"),
    ("scalars", [(0, "c", b"1234")], "complex scalar takes 8 or 16"),
    ("scalars", [(0, "b", b"12")], "bool scalar takes 1 byte"),
    ("scalars", [(-1, "i", b"1234")], "position must be >= 0"),
    ("scalars", [(3, "i", b"1234"), (3, "i", b"1234")],
     "strictly increasing"),
    ("scalars", [(4, "i", b"1234")], "past the kernel's parameters"),
])
def test_values_no_launch_can_take_fail(name, value, message):
    with pytest.raises(ValueError, match=message):
        _core.LoadedKernel(**_fields(**{name: value}))


def test_grid_from_needs_an_output():
    with pytest.raises(ValueError, match="grid_from needs an output"):
        _core.LoadedKernel(**_fields(num_outputs=0, aliases=[], lead_units=[],
                                   trail_units=[]))


def test_wrong_types_fail():
    with pytest.raises(TypeError):
        _core.LoadedKernel(**_fields(functions=[-1]))  # not a handle
    with pytest.raises(TypeError):
        _core.LoadedKernel(**_fields(num_inputs=2.0))


def test_scalars_are_packed_as_numbas_launch_packs_them():
    """Each scalar in the low bytes of its word(s), as ctypes' c_<type>
    (what Numba's launch hands the driver) holds it; a complex as two."""
    import ctypes

    import numpy as np

    def low_word(c):
        raw = bytes(c) + b"\0" * (8 - ctypes.sizeof(c))
        return int.from_bytes(raw, "little", signed=True)

    cases = [
        (np.float32(1.5), [low_word(ctypes.c_float(1.5))]),
        (np.float64(-2.25), [low_word(ctypes.c_double(-2.25))]),
        (np.int16(-3), [low_word(ctypes.c_int16(-3))]),
        (np.uint8(200), [low_word(ctypes.c_uint8(200))]),
        (np.int64(-(2**40)), [-(2**40)]),
        (np.bool_(True), [1]),
        (np.float16(1.0), [0x3C00]),
        (np.complex64(1 - 2j), [low_word(ctypes.c_float(1)),
                                low_word(ctypes.c_float(-2))]),
    ]
    for value, words in cases:
        array = np.asarray(value)
        loaded = _core.LoadedKernel(**_fields(
            scalars=[(1, array.dtype.kind, array.tobytes())]))
        assert loaded.scalars == [(1, words)], value


def test_scalars_refused_for_memref_kernels():
    with pytest.raises(ValueError, match="numba-cuda-mlir"):
        _core.LoadedKernel(**_fields(abi=1, scalars=[(0, "i", b"1234")]))
