#include "python_errors.h"

#include "python_hooks.h"

namespace numbax {

std::string TakePythonError() {
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  if (traceback && value) PyException_SetTraceback(value, traceback);
  std::string text;
  if (value && Hooks().format_exception) {
    PyObject* s = PyObject_CallOneArg(Hooks().format_exception, value);
    if (s && PyUnicode_Check(s)) {
      const char* utf8 = PyUnicode_AsUTF8(s);
      if (utf8) text = utf8;
    }
    Py_XDECREF(s);
    PyErr_Clear();  // the formatter itself must not leave an error behind
  }
  if (text.empty() && value) {
    PyObject* str = PyObject_Str(value);
    // backslashreplace: a lone surrogate must not make it unprintable.
    PyObject* s =
        str ? PyUnicode_AsEncodedString(str, "utf-8", "backslashreplace")
            : nullptr;
    Py_XDECREF(str);
    const char* utf8 = s ? PyBytes_AsString(s) : nullptr;
    text = std::string(type ? reinterpret_cast<PyTypeObject*>(type)->tp_name
                            : "Exception") +
           ": " + (utf8 ? utf8 : "<unprintable>");
    Py_XDECREF(s);
    PyErr_Clear();
  }
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(traceback);
  return text;
}

std::string OpMessage(OpKind kind, std::string_view key,
                      std::string_view what) {
  std::string_view noun = kind == OpKind::kKernel      ? "numbax kernel '"
                          : kind == OpKind::kCpuKernel ? "numbax numba_kernel '"
                                                       : "numbax op '";
  std::string_view mode =
      kind == OpKind::kCapture ? "' (capture=True): " : "': ";
  std::string text;
  text.reserve(noun.size() + key.size() + mode.size() + what.size());
  text.append(noun).append(key).append(mode).append(what);
  return text;
}

}  // namespace numbax
