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

void Dealloc(PyObject* self) {
  auto* hook = reinterpret_cast<MethodHook*>(self);
  PyTypeObject* type = Py_TYPE(self);
  Py_XDECREF(hook->original);
  for (PyObject*& ref : hook->refs) Py_CLEAR(ref);
  type->tp_free(self);
  Py_DECREF(type);
}

PyMemberDef kMembers[] = {
    {"__vectorcalloffset__", T_PYSSIZET,
     static_cast<Py_ssize_t>(offsetof(MethodHook, vectorcall)), READONLY,
     nullptr},
    {"original", T_OBJECT,
     static_cast<Py_ssize_t>(offsetof(MethodHook, original)), READONLY,
     nullptr},
    {nullptr, 0, 0, 0, nullptr}};

}  // namespace

PyTypeObject* NewMethodHookType(const char* name, const char* doc) {
  PyType_Slot slots[] = {
      {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)},
      {Py_tp_descr_get, reinterpret_cast<void*>(DescrGet)},
      {Py_tp_dealloc, reinterpret_cast<void*>(Dealloc)},
      {Py_tp_members, kMembers},
      {Py_tp_doc, const_cast<char*>(doc)},
      {0, nullptr}};
  // METHOD_DESCRIPTOR: as a class attribute it is called with the instance
  // prepended, like a function, without a bound method per call.
  PyType_Spec spec = {name, sizeof(MethodHook), 0,
                      Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL |
                          Py_TPFLAGS_METHOD_DESCRIPTOR,
                      slots};
  return reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&spec));
}

PyObject* NewMethodHook(PyTypeObject* type, vectorcallfunc call,
                        PyObject* original,
                        std::initializer_list<PyObject*> refs) {
  if (type == nullptr) return nullptr;
  if (refs.size() > 3) {
    PyErr_SetString(PyExc_ValueError, "a method hook holds 3 objects at most");
    return nullptr;
  }
  auto* hook = PyObject_New(MethodHook, type);
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
  return reinterpret_cast<PyObject*>(hook);
}

}  // namespace numbax
