"""Spin-then-sleep flags for the CPU runtime's handoffs: a small C extension built on first use.

A handoff between two Python threads costs two sleeps and wake-ups of a thread (the worker
waiting for its job, the caller waiting at the join), tens of microseconds each on a VM. A
:class:`Flag` waits without the GIL: it spins on an atomic for a bounded time (a thread that is
about to be handed work finds it at once), then sleeps on a condition variable. ``wait(spin_ns,
then)`` sets ``then`` after releasing the GIL, so a worker can signal the end of its job at the
moment the caller can take the GIL without waiting for it.

The extension (plain C against Python's headers, no torch) is compiled once per Python build
into airstream's cache directory with the C compiler Python was built with. Where that fails,
:func:`flag_type` returns ``None`` once with a warning and the runtime keeps its lock handoff.
``AIRSTREAM_HANDOFF=locks`` chooses the lock handoff.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
import warnings
from pathlib import Path
from typing import Any

__all__ = ["SPIN_NS", "flag_type"]

# How long a waiter spins before it sleeps: longer than a handoff takes when both threads are
# running, short enough that an idle worker gives its core back to the caller's own torch work.
SPIN_NS = 50_000

_SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

typedef struct {
    PyObject_HEAD
    atomic_int state;
    atomic_int sleepers;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} Flag;

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int Flag_init(Flag *self, PyObject *args, PyObject *kw) {
    atomic_store(&self->state, 0);
    atomic_store(&self->sleepers, 0);
    pthread_mutex_init(&self->mu, NULL);
    pthread_cond_init(&self->cv, NULL);
    return 0;
}

static void Flag_dealloc(Flag *self) {
    pthread_mutex_destroy(&self->mu);
    pthread_cond_destroy(&self->cv);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static void flag_set(Flag *self) {
    atomic_store(&self->state, 1);
    if (atomic_load(&self->sleepers)) {
        pthread_mutex_lock(&self->mu);
        pthread_cond_broadcast(&self->cv);
        pthread_mutex_unlock(&self->mu);
    }
}

static PyObject *Flag_set(Flag *self, PyObject *unused) {
    flag_set(self);
    Py_RETURN_NONE;
}

static PyObject *Flag_clear(Flag *self, PyObject *unused) {
    atomic_store(&self->state, 0);
    Py_RETURN_NONE;
}

static PyObject *Flag_is_set(Flag *self, PyObject *unused) {
    return PyBool_FromLong(atomic_load(&self->state));
}

static PyTypeObject FlagType;

static PyObject *Flag_wait(Flag *self, PyObject *args) {
    long long spin_ns = 0;
    PyObject *then = Py_None;
    if (!PyArg_ParseTuple(args, "|LO", &spin_ns, &then)) return NULL;
    if (then != Py_None && !PyObject_TypeCheck(then, &FlagType)) {
        PyErr_SetString(PyExc_TypeError, "wait(spin_ns, then): then must be a Flag or None");
        return NULL;
    }
    if (then == Py_None && atomic_load(&self->state)) Py_RETURN_NONE;
    Py_INCREF(then);
    PyThreadState *ts = PyEval_SaveThread();
    if (then != Py_None) flag_set((Flag *)then);
    if (!atomic_load(&self->state) && spin_ns > 0) {
        long long deadline = now_ns() + spin_ns;
        int n = 0;
        while (!atomic_load(&self->state)) {
            relax();
            if (++n == 64) {
                n = 0;
                if (now_ns() > deadline) break;
            }
        }
    }
    int interrupted = 0;
    if (!atomic_load(&self->state)) {
        pthread_mutex_lock(&self->mu);
        atomic_fetch_add(&self->sleepers, 1);
        while (!atomic_load(&self->state)) {
            /* Sleep in slices: between them, a signal (Ctrl-C) reaches the main thread as it
               would in a lock's acquire. */
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += 20000000L;
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec += 1;
                until.tv_nsec -= 1000000000L;
            }
            if (pthread_cond_timedwait(&self->cv, &self->mu, &until) == ETIMEDOUT
                && !atomic_load(&self->state)) {
                pthread_mutex_unlock(&self->mu);
                PyEval_RestoreThread(ts);
                int failed = PyErr_CheckSignals() < 0;
                ts = PyEval_SaveThread();
                pthread_mutex_lock(&self->mu);
                if (failed) {
                    interrupted = 1;
                    break;
                }
            }
        }
        atomic_fetch_sub(&self->sleepers, 1);
        pthread_mutex_unlock(&self->mu);
    }
    PyEval_RestoreThread(ts);
    Py_DECREF(then);
    if (interrupted) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef Flag_methods[] = {
    {"set", (PyCFunction)Flag_set, METH_NOARGS, "Set the flag and wake every waiter."},
    {"clear", (PyCFunction)Flag_clear, METH_NOARGS, "Clear the flag."},
    {"is_set", (PyCFunction)Flag_is_set, METH_NOARGS, "Whether the flag is set."},
    {"wait", (PyCFunction)Flag_wait, METH_VARARGS,
     "wait(spin_ns=0, then=None): without the GIL, set `then`, spin up to spin_ns for this "
     "flag, then sleep until it is set; a signal handler's exception (KeyboardInterrupt) "
     "ends the wait."},
    {NULL}
};

static PyTypeObject FlagType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "airstream_handoff.Flag",
    .tp_basicsize = sizeof(Flag),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Flag_init,
    .tp_dealloc = (destructor)Flag_dealloc,
    .tp_methods = Flag_methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "airstream_handoff", NULL, -1, NULL};

PyMODINIT_FUNC PyInit_airstream_handoff(void) {
    if (PyType_Ready(&FlagType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&FlagType);
    if (PyModule_AddObject(m, "Flag", (PyObject *)&FlagType) < 0) {
        Py_DECREF(&FlagType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
"""


def _cache_dir() -> Path:
    root = os.environ.get("AIRSTREAM_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "airstream"


def _build(target: Path) -> None:
    """Compile the extension to ``target`` (atomically: another process may build it too)."""
    compiler = shlex.split(sysconfig.get_config_var("CC") or "cc")
    include = sysconfig.get_paths()["include"]
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        source = Path(tmp) / "airstream_handoff.c"
        source.write_text(_SOURCE)
        built = Path(tmp) / target.name
        command = [*compiler, "-O2", "-shared", "-fPIC", f"-I{include}", str(source)]
        done = subprocess.run(
            [*command, "-o", str(built), "-lpthread"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise OSError(f"{' '.join(command)} failed: {done.stderr.strip()[:500]}")
        os.replace(built, target)


@functools.cache
def flag_type() -> Any:
    """The ``Flag`` class, building the extension on first use; ``None`` where it cannot be built
    or ``AIRSTREAM_HANDOFF=locks`` is set (warned once)."""
    if os.environ.get("AIRSTREAM_HANDOFF", "").strip().lower() == "locks":
        return None
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    key = hashlib.sha1((_SOURCE + sys.version).encode()).hexdigest()[:12]
    target = _cache_dir() / "handoff" / key / f"airstream_handoff{suffix}"
    try:
        if not target.exists():
            _build(target)
        loader = importlib.machinery.ExtensionFileLoader("airstream_handoff", str(target))
        spec = importlib.util.spec_from_file_location("airstream_handoff", target, loader=loader)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        return module.Flag
    except (OSError, ImportError, subprocess.SubprocessError) as error:
        warnings.warn(
            f"airstream: the CPU runtime's spinning handoff is unavailable ({error}); side "
            "streams hand off with locks (tens of microseconds more per call). It needs the C "
            "compiler Python was built with and Python's headers (python3-dev).",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
