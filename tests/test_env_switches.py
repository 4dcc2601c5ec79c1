"""numbax's boolean environment switches all read one way (numbax.runtime.env).

Before: NUMBAX_ALLOW_UNTESTED_FFI=false (or no, off, " 0") turned the
untested-FFI check off, NUMBAX_CHECK_INPUTS=false turned the input check on,
while NUMBAX_FAST_LAUNCH read the same words as off. Now every switch takes
the same words (case and surrounding whitespace ignored), and a value that is
none of them warns, naming the variable and the words, and keeps the default.
"""

import warnings

import jax
import jax.numpy as jnp
import pytest
from numba import cuda

import numbax
from numbax.callable import inputcheck
from numbax.runtime import compat, env

TRUE_WORDS = ["1", "true", "True", "YES", "on", " 1 ", "\ttrue\n", "On"]
FALSE_WORDS = ["0", "false", "False", "NO", "off", " 0", "0 ", " off\n", "OFF"]


def _untested_ffi_allowed() -> bool:
    # A jaxlib with FFI 0.6, newer than any served: refused unless allowed.
    return compat.problem("0.13.0", "0.13.0", (0, 2), (0, 6)) is None


SWITCHES = {
    # variable: (reads it now, its value when unset)
    compat.ALLOW_UNTESTED_ENV: (_untested_ffi_allowed, False),
    inputcheck.ENV_VAR: (inputcheck.enabled, False),
    env.FAST_LAUNCH_ENV: (env.fast_launch_enabled, True),
}


@pytest.fixture(autouse=True)
def _fresh_warnings():
    env._warned.clear()
    yield
    env._warned.clear()


@pytest.mark.parametrize("name", sorted(SWITCHES))
@pytest.mark.parametrize("word, on", [(w, True) for w in TRUE_WORDS]
                         + [(w, False) for w in FALSE_WORDS])
def test_true_and_false_words_turn_every_switch_on_and_off(
        monkeypatch, name, word, on):
    read, _ = SWITCHES[name]
    monkeypatch.setenv(name, word)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read() is on


@pytest.mark.parametrize("name", sorted(SWITCHES))
@pytest.mark.parametrize("word", [None, "", "   "])
def test_unset_or_empty_keeps_the_default(monkeypatch, name, word):
    read, default = SWITCHES[name]
    if word is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, word)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read() is default


@pytest.mark.parametrize("name", sorted(SWITCHES))
@pytest.mark.parametrize("word", ["maybe", "2", "enable", "tru"])
def test_unknown_word_warns_naming_the_variable_and_keeps_the_default(
        monkeypatch, name, word):
    read, default = SWITCHES[name]
    monkeypatch.setenv(name, word)
    with pytest.warns(RuntimeWarning) as record:
        assert read() is default
    message = str(record[0].message)
    assert name in message and repr(word) in message
    for accepted in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        assert accepted in message
    assert ("on" if default else "off") in message  # what it does instead


def test_an_unknown_word_warns_once_per_value(monkeypatch):
    monkeypatch.setenv(inputcheck.ENV_VAR, "maybe")
    with pytest.warns(RuntimeWarning):
        inputcheck.enabled()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        inputcheck.enabled()  # the same value again: no second warning


@cuda.jit
def _copy(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i]


def _clean(x, out, stream):
    _copy[1, 8, stream](x, out)


@pytest.mark.parametrize("word, checked", [("false", False), ("no", False),
                                           ("off", False), ("true", True)])
def test_check_inputs_false_leaves_func_unwrapped(monkeypatch, word, checked):
    # Before: NUMBAX_CHECK_INPUTS=false wrapped func in the input check.
    monkeypatch.setenv(inputcheck.ENV_VAR, word)
    op = numbax.numba_cuda_callable(_clean, jax.ShapeDtypeStruct((8,), jnp.float32))
    assert (op._called is not _clean) is checked
    x = jnp.arange(8, dtype=jnp.float32)
    assert (jax.jit(op)(x) == x).all()
