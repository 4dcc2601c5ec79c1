# Type stub of numbax's C++ extension (csrc/module.cc, built with nanobind).
# Its functions are internal and change with the C++ side; they are typed as
# Any here so the Python modules that call them type-check.
from typing import Any

def __getattr__(name: str) -> Any: ...
