#include "configure_hook.h"

#include "method_hook.h"

namespace numbax {
namespace {

// The configure hook is a MethodHook (method_hook.h) holding Numba's
// __getitem__ (`original`), the lru_cache wrapper and the class.
constexpr int kConfigure = 0;  // refs[kConfigure]: CUDADispatcher.configure
constexpr int kClass = 1;      // refs[kClass]: CUDADispatcher

PyObject* Interned(const char* s) {
  PyObject* o = PyUnicode_InternFromString(s);
  if (!o) PyErr_Clear();
  return o;  // kept for the process
}

// True when `self.configure` is the lru_cache wrapper the hook holds: an
// exact instance of the class, whose class still has that wrapper (not
// patched since) and whose own __dict__ does not hold a `configure`.
bool TakesDirectCall(const MethodHook* hook, PyObject* self) {
  auto* cls = reinterpret_cast<PyTypeObject*>(hook->refs[kClass]);
  if (Py_TYPE(self) != cls) return false;
  static PyObject* s_configure = Interned("configure");
  if (!s_configure) return false;
  PyObject* current = PyDict_GetItemWithError(cls->tp_dict, s_configure);
  if (current != hook->refs[kConfigure]) {  // borrowed; null on error
    PyErr_Clear();
    return false;
  }
  PyObject* dict = PyObject_GenericGetDict(self, nullptr);
  if (dict == nullptr) {
    PyErr_Clear();
    return false;
  }
  int own = PyDict_Contains(dict, s_configure);
  Py_DECREF(dict);
  if (own < 0) PyErr_Clear();
  return own == 0;
}

// Called as an unbound method: args[0] the dispatcher, args[1] the key.
PyObject* ConfigureVectorcall(PyObject* callable, PyObject* const* args,
                              size_t nargsf, PyObject* kwnames) {
  auto* hook = reinterpret_cast<MethodHook*>(callable);
  const Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  if (n == 2 && kwnames == nullptr && PyTuple_CheckExact(args[1])) {
    PyObject* key = args[1];
    const Py_ssize_t k = PyTuple_GET_SIZE(key);
    // Numba's __getitem__ accepts 2, 3 or 4 items (and raises its own
    // ValueError otherwise): the same as self.configure(*key).
    if (k >= 2 && k <= 4 && TakesDirectCall(hook, args[0])) {
      PyObject* stack[5];
      stack[0] = args[0];
      for (Py_ssize_t i = 0; i < k; ++i)
        stack[i + 1] = PyTuple_GET_ITEM(key, i);
      return PyObject_Vectorcall(hook->refs[kConfigure], stack,
                                 static_cast<size_t>(k + 1), nullptr);
    }
  }
  return PyObject_Vectorcall(hook->original, args, nargsf, kwnames);
}

}  // namespace

PyObject* NewConfigureHook(PyObject* original, PyObject* configure,
                           PyObject* cls) {
  static PyTypeObject* type = NewMethodHookType("numbax._core.ConfigureHook");
  if (!PyCallable_Check(original) || !PyCallable_Check(configure) ||
      !PyType_Check(cls)) {
    PyErr_SetString(PyExc_TypeError,
                    "configure hook: original and configure must be callable, "
                    "cls a class");
    return nullptr;
  }
  return NewMethodHook(type, ConfigureVectorcall, original, {configure, cls});
}

}  // namespace numbax
