#include "configure_hook.h"

#include <structmember.h>

namespace numbax {
namespace {

struct ConfigureHook {
  PyObject_HEAD PyObject* original;
  PyObject* configure;
  PyObject* cls;
  vectorcallfunc vectorcall;
};

PyObject* Interned(const char* s) {
  PyObject* o = PyUnicode_InternFromString(s);
  if (!o) PyErr_Clear();
  return o;  // kept for the process
}

// True when `self.configure` is the class's lru_cache wrapper: an exact
// instance of the class whose own __dict__ does not hold a `configure`.
bool TakesDirectCall(const ConfigureHook* hook, PyObject* self) {
  if (reinterpret_cast<PyObject*>(Py_TYPE(self)) != hook->cls) return false;
  static PyObject* s_configure = Interned("configure");
  if (!s_configure) return false;
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
  auto* hook = reinterpret_cast<ConfigureHook*>(callable);
  const Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  if (n == 2 && kwnames == nullptr && PyTuple_CheckExact(args[1])) {
    PyObject* key = args[1];
    const Py_ssize_t k = PyTuple_GET_SIZE(key);
    // Numba's __getitem__ accepts 2, 3 or 4 items (and raises its own
    // ValueError otherwise): the same as self.configure(*key).
    if (k >= 2 && k <= 4 && TakesDirectCall(hook, args[0])) {
      PyObject* stack[5];
      stack[0] = args[0];
      for (Py_ssize_t i = 0; i < k; ++i) stack[i + 1] = PyTuple_GET_ITEM(key, i);
      return PyObject_Vectorcall(hook->configure, stack,
                                 static_cast<size_t>(k + 1), nullptr);
    }
  }
  return PyObject_Vectorcall(hook->original, args, nargsf, kwnames);
}

PyObject* DescrGet(PyObject* self, PyObject* obj, PyObject* /*type*/) {
  if (obj == nullptr || obj == Py_None) {
    Py_INCREF(self);
    return self;
  }
  return PyMethod_New(self, obj);
}

void Dealloc(PyObject* self) {
  auto* hook = reinterpret_cast<ConfigureHook*>(self);
  PyTypeObject* type = Py_TYPE(self);
  Py_XDECREF(hook->original);
  Py_XDECREF(hook->configure);
  Py_XDECREF(hook->cls);
  type->tp_free(self);
  Py_DECREF(type);
}

PyMemberDef kMembers[] = {
    {"__vectorcalloffset__", T_PYSSIZET,
     static_cast<Py_ssize_t>(offsetof(ConfigureHook, vectorcall)), READONLY,
     nullptr},
    {"original", T_OBJECT,
     static_cast<Py_ssize_t>(offsetof(ConfigureHook, original)), READONLY,
     nullptr},
    {nullptr, 0, 0, 0, nullptr}};

PyTypeObject* HookType() {
  static PyTypeObject* type = [] {
    PyType_Slot slots[] = {
        {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)},
        {Py_tp_descr_get, reinterpret_cast<void*>(DescrGet)},
        {Py_tp_dealloc, reinterpret_cast<void*>(Dealloc)},
        {Py_tp_members, kMembers},
        {Py_tp_doc,
         const_cast<char*>("numbax's replacement for Numba's "
                           "CUDADispatcher.__getitem__: the same "
                           "configure() call, without a Python frame")},
        {0, nullptr}};
    // METHOD_DESCRIPTOR: as a class attribute it is called with the
    // instance prepended, without a bound method per call.
    PyType_Spec spec = {"numbax._core.ConfigureHook", sizeof(ConfigureHook), 0,
                        Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL |
                            Py_TPFLAGS_METHOD_DESCRIPTOR,
                        slots};
    return reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&spec));
  }();
  return type;
}

}  // namespace

PyObject* NewConfigureHook(PyObject* original, PyObject* configure,
                           PyObject* cls) {
  PyTypeObject* type = HookType();
  if (!type) return nullptr;
  if (!PyCallable_Check(original) || !PyCallable_Check(configure) ||
      !PyType_Check(cls)) {
    PyErr_SetString(PyExc_TypeError,
                    "configure hook: original and configure must be callable, "
                    "cls a class");
    return nullptr;
  }
  auto* hook = PyObject_New(ConfigureHook, type);
  if (!hook) return nullptr;
  Py_INCREF(original);
  Py_INCREF(configure);
  Py_INCREF(cls);
  hook->original = original;
  hook->configure = configure;
  hook->cls = cls;
  hook->vectorcall = ConfigureVectorcall;
  return reinterpret_cast<PyObject*>(hook);
}

}  // namespace numbax
