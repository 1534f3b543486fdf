/* airstream's CPU handoff extension (built on first use by runtime/handoff.py).

   Flag: a spin-then-sleep event that waits without the GIL.
   run_team: runs a call's streams on the caller's own OpenMP team, bound at run time to the
   OpenMP library torch loaded (GOMP_parallel and friends, found with dlsym), so the side
   streams run on the threads torch's own parallel ops just used. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
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

/* The interpreter's main thread, the only one Python runs signal handlers in. */
static unsigned long main_thread_ident;

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
    /* Only the main thread sleeps in slices, to run a signal's handler between them. Another
       thread's slice would take the GIL 50 times a second to check for nothing: an idle stream
       worker taking it from the thread that is running torch work (and its cores, on a machine
       with no spare one) for as long as the process lives. */
    int sliced = PyThread_get_thread_ident() == main_thread_ident;
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
        while (!sliced && !atomic_load(&self->state)) pthread_cond_wait(&self->cv, &self->mu);
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


/* ---- run_team: the caller's OpenMP team runs one function per thread ---- */

typedef void (*gomp_parallel_fn)(void (*)(void *), void *, unsigned, unsigned);
typedef int (*omp_int_fn)(void);
static gomp_parallel_fn gomp_parallel;
/* Set in a forked child: GNU OpenMP's thread pool there still lists the parent's team threads,
   which do not exist in the child, and a region waiting for them never ends. */
static int team_forked;
static omp_int_fn omp_thread_num, omp_num_threads, omp_in_parallel;

/* A team thread's Python thread state, made on its first job and kept while the thread lives:
   OpenMP's pool threads outlive the calls they run. */
static __thread PyThreadState *team_state;

typedef struct {
    PyObject *fns;          /* tuple: fns[0] runs on the caller, fns[i] on team thread i */
    Py_ssize_t n;
    PyThreadState *caller;  /* the caller's thread state, given up for the region */
    PyObject *result;       /* fns[0]'s result */
    PyObject *exc_type, *exc_value, *exc_tb; /* fns[0]'s exception */
    atomic_int short_team;  /* the runtime gave fewer threads than asked: nothing ran */
} TeamCall;

static void team_body(void *data) {
    TeamCall *call = (TeamCall *)data;
    int t = omp_thread_num();
    if (omp_num_threads() != call->n) {
        atomic_store(&call->short_team, 1);
        return;
    }
    if (t == 0) {
        PyEval_RestoreThread(call->caller);
        call->result = PyObject_CallNoArgs(PyTuple_GET_ITEM(call->fns, 0));
        if (call->result == NULL) PyErr_Fetch(&call->exc_type, &call->exc_value, &call->exc_tb);
        call->caller = PyEval_SaveThread();
        return;
    }
    if (team_state == NULL) {
        PyGILState_Ensure(); /* never released: the state lives as long as the thread */
    } else {
        PyEval_RestoreThread(team_state);
    }
    PyObject *fn = PyTuple_GET_ITEM(call->fns, t);
    PyObject *then = PyObject_CallNoArgs(fn);
    if (then == NULL) PyErr_WriteUnraisable(fn); /* jobs catch their own errors */
    Flag *flag = NULL;
    if (then != NULL && PyObject_TypeCheck(then, &FlagType) && Py_REFCNT(then) > 1) {
        /* Set after letting go of the GIL. The flag outlives this reference: the caller's
           run_team cannot return (and its call's objects, which hold the flag, cannot be
           dropped) before GOMP_parallel's join, which waits for this function to end. */
        flag = (Flag *)then;
        Py_DECREF(then);
    } else if (then != NULL && PyObject_TypeCheck(then, &FlagType)) {
        flag_set((Flag *)then);
        Py_DECREF(then);
    } else if (then != NULL && then != Py_None) { /* another flag kind: set it with the GIL */
        PyObject *done = PyObject_CallMethod(then, "set", NULL);
        if (done == NULL) PyErr_WriteUnraisable(then);
        Py_XDECREF(done);
        Py_DECREF(then);
    } else {
        Py_XDECREF(then);
    }
    team_state = PyEval_SaveThread();
    if (flag != NULL) flag_set(flag); /* without the GIL: its waiter resumes at once */
}

static PyObject *team_bind(PyObject *module, PyObject *args) {
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path)) return NULL;
    void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL) Py_RETURN_FALSE;
    gomp_parallel = (gomp_parallel_fn)dlsym(lib, "GOMP_parallel");
    omp_thread_num = (omp_int_fn)dlsym(lib, "omp_get_thread_num");
    omp_num_threads = (omp_int_fn)dlsym(lib, "omp_get_num_threads");
    omp_in_parallel = (omp_int_fn)dlsym(lib, "omp_in_parallel");
    if (!gomp_parallel || !omp_thread_num || !omp_num_threads || !omp_in_parallel) {
        gomp_parallel = NULL;
        Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

static PyObject *run_team(PyObject *module, PyObject *fns) {
    if (gomp_parallel == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "run_team: bind() an OpenMP library first");
        return NULL;
    }
    if (!PyTuple_Check(fns) || PyTuple_GET_SIZE(fns) < 2) {
        PyErr_SetString(PyExc_TypeError, "run_team(fns): fns must be a tuple of 2+ callables");
        return NULL;
    }
    if (team_forked) Py_RETURN_NONE;
    if (omp_in_parallel()) Py_RETURN_NONE; /* a nested region would run on one thread */
    TeamCall call = {.fns = fns, .n = PyTuple_GET_SIZE(fns)};
    atomic_store(&call.short_team, 0);
    Py_INCREF(fns);
    call.caller = PyEval_SaveThread();
    gomp_parallel(team_body, &call, (unsigned)call.n, 0);
    PyEval_RestoreThread(call.caller);
    Py_DECREF(fns);
    if (atomic_load(&call.short_team)) {
        Py_XDECREF(call.result);
        Py_RETURN_NONE;
    }
    if (call.exc_type != NULL) {
        PyErr_Restore(call.exc_type, call.exc_value, call.exc_tb);
        return NULL;
    }
    PyObject *out = PyTuple_Pack(1, call.result);
    Py_DECREF(call.result);
    return out;
}

static PyObject *team_after_fork(PyObject *module, PyObject *unused) {
    team_forked = 1;
    main_thread_ident = PyThread_get_thread_ident(); /* the child's main thread: the forker */
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"after_fork", team_after_fork, METH_NOARGS,
     "after_fork(): in a forked child, run_team returns None from now on (nothing runs), and "
     "the calling thread is the one whose waits look for signals."},
    {"bind", team_bind, METH_VARARGS,
     "bind(path): use the OpenMP library loaded from path for run_team; False if it is not "
     "loaded or lacks GNU OpenMP's entry points."},
    {"run_team", run_team, METH_O,
     "run_team(fns): call fns[0] on this thread and fns[i] on thread i of this thread's OpenMP "
     "team, all at once, without holding the GIL between calls; (fns[0]'s result,), or None "
     "where no team of len(fns) threads could be formed (nothing ran)."},
    {NULL}
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "airstream_handoff", NULL, -1,
                                    module_methods};

PyMODINIT_FUNC PyInit_airstream_handoff(void) {
    if (PyType_Ready(&FlagType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    PyObject *threading = PyImport_ImportModule("threading");
    PyObject *main_thread = threading ? PyObject_CallMethod(threading, "main_thread", NULL) : NULL;
    PyObject *ident = main_thread ? PyObject_GetAttrString(main_thread, "ident") : NULL;
    Py_XDECREF(main_thread);
    Py_XDECREF(threading);
    if (ident == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    main_thread_ident = PyLong_AsUnsignedLong(ident);
    Py_DECREF(ident);
    if (PyErr_Occurred()) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&FlagType);
    if (PyModule_AddObject(m, "Flag", (PyObject *)&FlagType) < 0) {
        Py_DECREF(&FlagType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
