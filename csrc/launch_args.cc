#include "launch_args.h"

#include <cstring>

namespace numbax {
namespace {

// Scalars are packed into the low bytes of 8-byte words (PackScalar).
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the fast launch path packs scalars for little-endian hosts");

// What a launch's argument types look like to Numba's dispatcher: an array
// numbax handed to func, or a view of one, is (layout, dtype, rank), exactly
// Numba's array type; anything else its Python type (the plan builder
// accepts only scalar types whose Numba type depends on the type alone; a
// Python int must fit int64).
constexpr uint64_t kArrayTag = uint64_t{1} << 63;

uint64_t ArrayCode(char layout, ffi::DataType dtype, int64_t rank) {
  return kArrayTag |
         (static_cast<uint64_t>(static_cast<unsigned char>(layout)) << 40) |
         (static_cast<uint64_t>(dtype) << 8) | static_cast<uint64_t>(rank);
}

PyObject* Interned(const char* s) {
  PyObject* o = PyUnicode_InternFromString(s);
  if (!o) PyErr_Clear();
  return o;  // kept for the process
}

bool ReadDims(PyObject* t, int64_t* out, int64_t* rank) {
  if (!t || !PyTuple_Check(t) || PyTuple_GET_SIZE(t) > kMaxRank) return false;
  *rank = PyTuple_GET_SIZE(t);
  for (Py_ssize_t i = 0; i < *rank; ++i) {
    PyObject* v = PyTuple_GET_ITEM(t, i);
    if (!PyLong_Check(v)) return false;
    int overflow = 0;
    out[i] = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (out[i] == -1 && PyErr_Occurred())) return false;
  }
  return true;
}

// Recognises `a` as a view (a slice or reshape) of one of the call's
// buffers: a Numba device array of the same type as numbax's, whose every
// byte lies inside one buffer of the same dtype. Fills `view` and `code`
// (the array's Numba type, as ArrayCode) and returns its kView* kind, or
// kOther. Reads only plain attributes and the data pointer, as Numba's
// packing does; any surprise means kOther, and the launch goes to Numba.
int RecogniseView(PyObject* a, const std::vector<BufferView>& buffers,
                  PyObject* const* arrays, ViewInfo* view, uint64_t* code) {
  if (buffers.empty()) return kOther;
  // numbax's arrays are a DeviceNDArray subclass; Numba makes some views of
  // them (squeeze, view) as plain DeviceNDArrays, its base.
  PyTypeObject* own = Py_TYPE(arrays[0]);
  if (Py_TYPE(a) != own &&
      (Py_TYPE(a) != own->tp_base || own->tp_base == &PyBaseObject_Type)) {
    return kOther;
  }
  static PyObject* s_shape = Interned("shape");
  static PyObject* s_strides = Interned("strides");
  static PyObject* s_dtype = Interned("dtype");
  static PyObject* s_pointer = Interned("device_ctypes_pointer");
  static PyObject* s_value = Interned("value");
  if (!s_shape || !s_strides || !s_dtype || !s_pointer || !s_value) {
    return kOther;
  }
  int kind = kOther;
  int64_t strides_rank = -1;
  PyObject* shape = PyObject_GetAttr(a, s_shape);
  PyObject* strides = shape ? PyObject_GetAttr(a, s_strides) : nullptr;
  PyObject* dtype = strides ? PyObject_GetAttr(a, s_dtype) : nullptr;
  PyObject* pointer = dtype ? PyObject_GetAttr(a, s_pointer) : nullptr;
  PyObject* value = pointer ? PyObject_GetAttr(pointer, s_value) : nullptr;
  uintptr_t data = 0;
  bool ok = value && ReadDims(shape, view->dims, &view->rank) &&
            ReadDims(strides, view->strides, &strides_rank) &&
            strides_rank == view->rank;
  if (ok && value != Py_None) {
    data = static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(value));
    ok = !PyErr_Occurred();
  }
  ok = ok && data != 0;
  for (size_t j = 0; ok && j < buffers.size(); ++j) {
    const BufferView& b = buffers[j];
    const DTypeInfo* info = LookupDType(b.dtype);
    const uintptr_t base = reinterpret_cast<uintptr_t>(b.data);
    if (!info || base == 0 || data < base || data >= base + b.nbytes) continue;
    // The extent of the view: its lowest and highest byte, overflow-checked.
    const int64_t itemsize = static_cast<int64_t>(info->itemsize);
    int64_t lo = 0, hi = itemsize, elements = 1;
    bool fits = true;
    for (int64_t d = 0; fits && d < view->rank; ++d) {
      int64_t reach;
      if (view->dims[d] <= 0 ||
          __builtin_mul_overflow(view->dims[d] - 1, view->strides[d], &reach) ||
          __builtin_add_overflow(reach < 0 ? lo : hi, reach,
                                 reach < 0 ? &lo : &hi) ||
          __builtin_mul_overflow(elements, view->dims[d], &elements)) {
        fits = false;
      }
    }
    const int64_t offset = static_cast<int64_t>(data - base);
    if (!fits || offset + lo < 0 ||
        offset + hi > static_cast<int64_t>(b.nbytes)) {
      continue;
    }
    PyObject* own_dtype = PyObject_GetAttr(arrays[j], s_dtype);
    const bool same_dtype = own_dtype == dtype;
    Py_XDECREF(own_dtype);
    if (!same_dtype) continue;
    const char layout =
        NumbaArrayLayout(view->dims, view->strides, view->rank, itemsize);
    if (layout == 0) break;
    view->data = reinterpret_cast<void*>(data);
    view->itemsize = info->itemsize;
    *code = ArrayCode(layout, b.dtype, view->rank);
    kind = layout == 'C' ? kViewC : layout == 'F' ? kViewF : kViewA;
    break;
  }
  Py_XDECREF(shape);
  Py_XDECREF(strides);
  Py_XDECREF(dtype);
  Py_XDECREF(pointer);
  Py_XDECREF(value);
  if (PyErr_Occurred()) PyErr_Clear();
  return kind;
}

}  // namespace

bool ReadLaunchArguments(PyObject* const* args, Py_ssize_t n,
                         const std::vector<BufferView>& buffers,
                         PyObject* const* arrays, std::vector<int>* slots,
                         std::vector<ViewInfo>* views,
                         std::vector<uint64_t>* codes) {
  if (views->size() < static_cast<size_t>(n)) views->resize(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* a = args[i];
    int slot = kOther;
    for (size_t j = 0; j < buffers.size(); ++j) {
      if (arrays[j] == a) {
        slot = static_cast<int>(j);
        break;
      }
    }
    if (slot >= 0) {
      const BufferView& v = buffers[static_cast<size_t>(slot)];
      slots->push_back(slot);
      codes->push_back(ArrayCode('C', v.dtype, v.rank));
      continue;
    }
    uint64_t code = 0;
    slot = RecogniseView(a, buffers, arrays, &(*views)[static_cast<size_t>(i)],
                         &code);
    slots->push_back(slot);
    if (slot != kOther) {
      codes->push_back(code);
      continue;
    }
    if (PyLong_CheckExact(a)) {
      // Numba types an int that does not fit int64 as uint64 (or refuses
      // it): such a value is not the type the plan was recorded for.
      int overflow = 0;
      PyLong_AsLongLongAndOverflow(a, &overflow);
      if (overflow != 0) return false;
    }
    codes->push_back(reinterpret_cast<uintptr_t>(Py_TYPE(a)));
  }
  return true;
}

PackResult PackLaunchArguments(const std::string& packing,
                               PyObject* const* args, Py_ssize_t n,
                               const std::vector<int>& slots,
                               const std::vector<ViewInfo>& views,
                               const std::vector<BufferView>& buffers,
                               KernelArgs* packed,
                               std::vector<AddressPatch>* patches) {
  if (patches) patches->clear();
  for (Py_ssize_t i = 0; i < n; ++i) {
    const char how = packing[static_cast<size_t>(i)];
    if (how == 'A' || how == 'M') {
      const int slot = slots[static_cast<size_t>(i)];
      const size_t first = packed->size();
      if (slot <= kViewC) {
        const ViewInfo& v = views[static_cast<size_t>(i)];
        packed->AddStridedArray(v.data, v.dims, v.strides, v.rank, v.itemsize);
        if (patches) {
          AddArrayPatches(packed->abi(), first, kOther, v.data, buffers,
                          patches);
        }
        continue;
      }
      if (slot < 0) {  // cannot happen: the key says which are arrays
        return PackResult::kPlanError;
      }
      const BufferView& v = buffers[static_cast<size_t>(slot)];
      const DTypeInfo* info = LookupDType(v.dtype);
      if (!info) return PackResult::kPlanError;
      packed->AddArray(v.data, v.dims, v.rank, info->itemsize);
      if (patches) {
        AddArrayPatches(packed->abi(), first, slot, v.data, buffers, patches);
      }
    } else if (!PackScalar(how, args[i], packed)) {
      // A value Numba's packing would refuse too: let it say so.
      PyErr_Clear();
      return PackResult::kForeignArgument;
    }
  }
  return PackResult::kPacked;
}

// Appends one scalar as an 8-byte word: cuLaunchKernel reads the parameter's
// own size from its start, i.e. the low bytes (little-endian), which is how
// ctypes truncates an int to a narrower C type too.
bool PackScalar(char how, PyObject* value, KernelArgs* packed) {
  int64_t word = 0;
  switch (how) {
    case 'i': {
      unsigned long long v = PyLong_AsUnsignedLongLongMask(value);
      if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
        return false;
      }
      std::memcpy(&word, &v, sizeof v);
      break;
    }
    case 'b': {
      int t = PyObject_IsTrue(value);
      if (t < 0) return false;
      word = t;
      break;
    }
    case 'f':
    case 'd': {
      double d = PyFloat_AsDouble(value);
      if (d == -1.0 && PyErr_Occurred()) return false;
      if (how == 'f') {
        float f = static_cast<float>(d);
        std::memcpy(&word, &f, sizeof f);
      } else {
        std::memcpy(&word, &d, sizeof d);
      }
      break;
    }
    case 'c':
    case 'z': {
      Py_complex c = PyComplex_AsCComplex(value);
      if (c.real == -1.0 && PyErr_Occurred()) return false;
      int64_t imag = 0;
      if (how == 'c') {
        float re = static_cast<float>(c.real), im = static_cast<float>(c.imag);
        std::memcpy(&word, &re, sizeof re);
        std::memcpy(&imag, &im, sizeof im);
      } else {
        std::memcpy(&word, &c.real, sizeof c.real);
        std::memcpy(&imag, &c.imag, sizeof c.imag);
      }
      packed->AddWord(word);
      packed->AddWord(imag);
      return true;
    }
    default:
      return false;
  }
  packed->AddWord(word);
  return true;
}

}  // namespace numbax
