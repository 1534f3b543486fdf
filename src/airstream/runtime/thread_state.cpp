// The caller's thread-local torch state, carried onto the thread that runs a side stream.
//
// at::ThreadLocalState is torch's own record of everything a thread's ops run under: grad and
// inference mode, the dispatch keys (autocast among them), torch function and dispatch modes,
// saved-tensor hooks, the profiler's state and callbacks. torch's autograd engine carries it
// onto its worker threads the same way: capture on the caller, ThreadLocalStateGuard on the
// worker for the job, the worker's own state restored after it.
//
//   capture() -> state            the calling thread's state (a capsule)
//   run(state, fn, *args) -> fn(*args) under that state, on the calling thread
//
// Both are called with the GIL held: the state holds Python objects (the modes).

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <ATen/ThreadLocalState.h>

#include <exception>

namespace {

const char* const kCapsule = "airstream.ThreadLocalState";

void destroy(PyObject* capsule) {
  delete static_cast<at::ThreadLocalState*>(PyCapsule_GetPointer(capsule, kCapsule));
}

PyObject* fail(const std::exception& error) {
  PyErr_SetString(PyExc_RuntimeError, error.what());
  return nullptr;
}

PyObject* capture(PyObject* /*module*/, PyObject* /*unused*/) {
  at::ThreadLocalState* state = nullptr;
  try {
    state = new at::ThreadLocalState();
  } catch (const std::exception& error) {
    return fail(error);
  }
  PyObject* capsule = PyCapsule_New(state, kCapsule, destroy);
  if (capsule == nullptr) {
    delete state;
  }
  return capsule;
}

PyObject* run(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 2) {
    PyErr_SetString(PyExc_TypeError, "run(state, fn, *args)");
    return nullptr;
  }
  auto* state = static_cast<at::ThreadLocalState*>(PyCapsule_GetPointer(args[0], kCapsule));
  if (state == nullptr) {
    return nullptr;
  }
  try {
    at::ThreadLocalStateGuard guard(*state);
    return PyObject_Vectorcall(args[1], args + 2, static_cast<size_t>(nargs - 2), nullptr);
  } catch (const std::exception& error) {
    return fail(error);
  }
}

PyMethodDef methods[] = {
    {"capture", capture, METH_NOARGS, "The calling thread's torch thread-local state."},
    {"run", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(run)), METH_FASTCALL,
     "run(state, fn, *args): fn(*args) under state, on the calling thread."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "airstream_thread_state", nullptr, -1, methods,
    nullptr, nullptr, nullptr, nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit_airstream_thread_state() { return PyModule_Create(&module_def); }
