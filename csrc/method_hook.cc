#include "method_hook.h"

#include <structmember.h>

#include <cstddef>

namespace numbax {
namespace {

PyObject* DescrGet(PyObject* self, PyObject* obj, PyObject* /*type*/) {
  if (obj == nullptr || obj == Py_None) {
    Py_INCREF(self);
    return self;
  }
  return PyMethod_New(self, obj);
}

// A hook sits in its class's __dict__ and may hold that class (the
// configure hook does), or objects that lead back to it: a cycle the
// garbage collector must be able to see and break.
int Traverse(PyObject* self, visitproc visit, void* arg) {
  auto* hook = reinterpret_cast<MethodHook*>(self);
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(hook->original);
  for (PyObject* ref : hook->refs) Py_VISIT(ref);
  return 0;
}

int Clear(PyObject* self) {
  auto* hook = reinterpret_cast<MethodHook*>(self);
  Py_CLEAR(hook->original);
  for (PyObject*& ref : hook->refs) Py_CLEAR(ref);
  return 0;
}

void Dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  Clear(self);
  type->tp_free(self);
  Py_DECREF(type);
}

// The replaced method's name, qualified name and docstring, and the method
// itself as __wrapped__ (which inspect.signature and help() follow), so
// that introspection of the class sees what it saw before.
PyObject* FromOriginal(PyObject* self, void* attribute) {
  auto* hook = reinterpret_cast<MethodHook*>(self);
  if (hook->original == nullptr) {
    PyErr_SetString(PyExc_AttributeError, static_cast<const char*>(attribute));
    return nullptr;
  }
  return PyObject_GetAttrString(hook->original,
                                static_cast<const char*>(attribute));
}

PyObject* Wrapped(PyObject* self, void* /*closure*/) {
  auto* hook = reinterpret_cast<MethodHook*>(self);
  if (hook->original == nullptr) Py_RETURN_NONE;
  Py_INCREF(hook->original);
  return hook->original;
}

PyMemberDef kMembers[] = {
    {"__vectorcalloffset__", T_PYSSIZET,
     static_cast<Py_ssize_t>(offsetof(MethodHook, vectorcall)), READONLY,
     nullptr},
    {"original", T_OBJECT,
     static_cast<Py_ssize_t>(offsetof(MethodHook, original)), READONLY,
     nullptr},
    {nullptr, 0, 0, 0, nullptr}};

PyGetSetDef kGetSets[] = {
    {"__wrapped__", Wrapped, nullptr, nullptr, nullptr},
    {"__name__", FromOriginal, nullptr, nullptr, const_cast<char*>("__name__")},
    {"__qualname__", FromOriginal, nullptr, nullptr,
     const_cast<char*>("__qualname__")},
    {"__doc__", FromOriginal, nullptr, nullptr, const_cast<char*>("__doc__")},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

}  // namespace

PyTypeObject* NewMethodHookType(const char* name) {
  PyType_Slot slots[] = {
      {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)},
      {Py_tp_descr_get, reinterpret_cast<void*>(DescrGet)},
      {Py_tp_dealloc, reinterpret_cast<void*>(Dealloc)},
      {Py_tp_traverse, reinterpret_cast<void*>(Traverse)},
      {Py_tp_clear, reinterpret_cast<void*>(Clear)},
      {Py_tp_members, kMembers},
      {Py_tp_getset, kGetSets},
      {0, nullptr}};
  // METHOD_DESCRIPTOR: as a class attribute it is called with the instance
  // prepended, like a function, without a bound method per call. Only C++
  // makes hooks (NewMethodHook), and their type cannot be changed.
  PyType_Spec spec = {
      name, sizeof(MethodHook), 0,
      Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
          Py_TPFLAGS_METHOD_DESCRIPTOR | Py_TPFLAGS_IMMUTABLETYPE |
          Py_TPFLAGS_DISALLOW_INSTANTIATION,
      slots};
  return reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&spec));
}

PyObject* NewMethodHook(PyTypeObject* type, vectorcallfunc call,
                        PyObject* original,
                        std::initializer_list<PyObject*> refs) {
  if (type == nullptr) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_RuntimeError,
                      "numbax: the method hook type could not be created");
    }
    return nullptr;
  }
  if (refs.size() > 3) {
    PyErr_SetString(PyExc_ValueError, "a method hook holds 3 objects at most");
    return nullptr;
  }
  auto* hook = PyObject_GC_New(MethodHook, type);
  if (!hook) return nullptr;
  Py_INCREF(original);
  hook->original = original;
  size_t i = 0;
  for (PyObject* ref : refs) {
    Py_XINCREF(ref);
    hook->refs[i++] = ref;
  }
  for (; i < 3; ++i) hook->refs[i] = nullptr;
  hook->vectorcall = call;
  PyObject_GC_Track(reinterpret_cast<PyObject*>(hook));
  return reinterpret_cast<PyObject*>(hook);
}

}  // namespace numbax
