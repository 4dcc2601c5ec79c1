// Errors that cross from Python, and from numbax's ops, into XLA.
//
// Every error an op returns to XLA starts with the same prefix naming the
// op and its key, so that a message in a long XLA log says which op failed;
// OpMessage is the one place that prefix is spelled.
#pragma once

#include <Python.h>

#include <string>
#include <string_view>

namespace numbax {

// Formats the pending Python exception (type, message, traceback) and clears
// it. Must be called with the GIL held and an exception set.
std::string TakePythonError();

// Which op an error is about; each kind has its own prefix:
//   kCallable  numba_cuda_callable         "numbax op 'KEY': "
//   kCapture   the same with capture=True  "numbax op 'KEY' (capture=True): "
//   kKernel    numba_cuda_kernel           "numbax kernel 'KEY': "
//   kCpuKernel numba_kernel                "numbax numba_kernel 'KEY': "
enum class OpKind { kCallable, kCapture, kKernel, kCpuKernel };

// `what`, prefixed with the op it is about. Built only when an error is
// returned: never on a call that succeeds.
std::string OpMessage(OpKind kind, std::string_view key, std::string_view what);

}  // namespace numbax
