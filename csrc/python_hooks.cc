#include "python_hooks.h"

namespace numbax {

namespace detail {
PythonHooks g_python_hooks;
}  // namespace detail

void SetPythonHooks(const PythonHooks& hooks) {
  PyObject* all[] = {hooks.resolve,     hooks.device_array,
                     hooks.host_array,  hooks.device_stream,
                     hooks.host_stream, hooks.format_exception};
  for (PyObject* o : all) Py_XINCREF(o);
  detail::g_python_hooks = hooks;
}

}  // namespace numbax
