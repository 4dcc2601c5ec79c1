"""What XLA calls back into, and what the process sets up once.

The registry of op keys and the resolvers C++ calls when XLA instantiates a
program (``registry``, ``keys``, ``ops``), the fixed FFI targets and their
registration (``targets``), the hooks C++ calls around a func (``guard``,
``numba_bridge``), and the JAX versions and environment switches numbax
reads at import (``compat``, ``env``). Every other part of numbax builds on
this folder; it imports none of them.
"""
