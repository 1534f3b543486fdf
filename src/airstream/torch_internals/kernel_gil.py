"""Inductor's CPU kernels called without the GIL while they run.

Inductor binds each C++ kernel it generates to Python with a few lines of C++ it appends to the
kernel's source (``CppPythonBindingsCodeCache``: ``suffix_template``, whose call is
``call_entry_function``): they parse the argument tuple and call the kernel with the GIL held.
ATen's own ops let go of the GIL while they compute; Inductor's kernels do not, so the kernels of
two streams, each on its own thread, take turns (measured in docs/benchmarks.md).

While airstream compiles a segment, :func:`kernels_without_gil` makes the binding parse the
arguments with the GIL held, as before, and then call the kernel without it. That is safe
because a kernel reads and writes raw pointers and plain numbers only, and the caller's argument
tuple keeps the tensors alive until it returns. A C++ exception from a kernel (an index
assertion) takes the GIL back before the binding turns it into a Python error.

The binding's text is formatted when a kernel is loaded (after Inductor compiled it, or on an FX
graph cache hit, both inside ``compile_fx_inner``), and its text is part of the key of the
compiled library, so patching the two class attributes for the duration of airstream's compile
reaches airstream's kernels, not those plain ``torch.compile`` loads before or after (one that
another thread loads during it lets go of the GIL too, which changes nothing it computes). A
kernel module this process already loaded for identical code is reused as it loaded.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from airstream.errors import TorchSupportError
from airstream.torch_internals.registry import _attr, _feature, _get, _optional

__all__ = ["GIL_GUARD", "bind_cpu_kernel", "cpu_kernel_sources", "kernels_without_gil"]

# torch 2.11-2.15's binding: the call, and where helper definitions go (after <Python.h>).
_TORCH_CALL = "kernel({}); Py_RETURN_NONE;"
_TORCH_HELPERS = ""

# The name of the guard in the generated C++ (tests look for it in a kernel's source).
GIL_GUARD = "AirstreamKernelWithoutGil"

# Both strings are formatted once more by Inductor (``str.format``): braces are doubled.
_HELPERS = (
    "#include <tuple>\n"
    f"namespace {{{{ struct {GIL_GUARD} {{{{\n"
    "    PyThreadState* state;\n"
    f"    {GIL_GUARD}() : state(PyEval_SaveThread()) {{{{}}}}\n"
    f"    ~{GIL_GUARD}() {{{{ PyEval_RestoreThread(state); }}}}\n"
    f"    {GIL_GUARD}(const {GIL_GUARD}&) = delete;\n"
    f"    {GIL_GUARD}& operator=(const {GIL_GUARD}&) = delete;\n"
    "}}; }}\n"
)
_CALL = (
    "auto airstream_args = std::make_tuple({}); "
    f"{{{{ {GIL_GUARD} released; std::apply(kernel, airstream_args); }}}} "
    "Py_RETURN_NONE;"
)


@_feature(
    "kernels_without_gil",
    "torch._inductor.codecache.CppPythonBindingsCodeCache.call_entry_function, "
    ".extra_parse_arg and .suffix_template (the C++ that binds a CPU kernel to Python)",
    "kernels-without-gil",
    "calling the CPU kernels of airstream's Inductor segments without the GIL, so that two "
    "streams' kernels run at once",
)
def _probe_kernels_without_gil() -> Any:
    binding = _attr("torch._inductor.codecache:CppPythonBindingsCodeCache")
    own = vars(binding)
    if own.get("call_entry_function") != _TORCH_CALL:
        raise ValueError(f"call_entry_function is {own.get('call_entry_function')!r}")
    if own.get("extra_parse_arg") != _TORCH_HELPERS or own.get("entry_function") != "kernel":
        raise ValueError("the binding's extra_parse_arg or entry_function changed")
    template = own.get("suffix_template", "")
    python_h = template.find("#include <Python.h>")
    helpers = template.find("{extra_parse_arg}")
    if not 0 <= python_h < helpers < template.find("{call_entry_func}"):
        raise ValueError(
            "suffix_template no longer includes <Python.h>, then the helpers, then the call"
        )
    return binding


def _binding(warn: bool) -> Any | None:
    """The binding's class, or None where this torch's is not the one airstream knows."""
    if warn:
        until = "Inductor's CPU kernels hold the GIL: segments on different streams take turns"
        return _optional("kernels_without_gil", until)
    try:
        return _get("kernels_without_gil")
    except TorchSupportError:
        return None


_lock = threading.Lock()
_active = 0  # compiles inside kernels_without_gil: the first patches, the last restores


@contextlib.contextmanager
def kernels_without_gil(warn: bool = True) -> Iterator[bool]:
    """Inside, the CPU kernels Inductor loads let go of the GIL while they run (True), or, where
    this torch's binding is not the one airstream knows, hold it as before (False; ``warn``:
    one warning per process saying so)."""
    global _active
    binding = _binding(warn)
    if binding is None:
        yield False
        return
    with _lock:
        if _active == 0:
            binding.call_entry_function, binding.extra_parse_arg = _CALL, _HELPERS
        _active += 1
    try:
        yield True
    finally:
        with _lock:
            _active -= 1
            if _active == 0:
                binding.call_entry_function = _TORCH_CALL
                binding.extra_parse_arg = _TORCH_HELPERS


# --- for the tests: what a loaded kernel's binding does -----------------------------------------


def cpu_kernel_sources() -> dict[str, Path]:
    """Every C++ kernel module Inductor's binding has loaded in this process (its module name,
    ``<key>.kernel``): the path of the C++ source it was built from, binding included."""
    entry = _get("kernels_without_gil").entry_function
    found = {}
    for name, module in list(sys.modules.items()):
        library = getattr(module, "__file__", None) or ""
        if name.endswith(f".{entry}") and library.endswith(".so"):
            found[name] = Path(library).with_suffix(".cpp")
    return found


@_feature(
    "cpu_kernel_binding",
    "torch._inductor.codecache.CppPythonBindingsCodeCache.load_pybinding(argtypes, main_code)",
    "testing",
    "tests that bind a hand-written C++ kernel the way Inductor binds its own",
)
def _probe_cpu_kernel_binding() -> Callable[..., Any]:
    load = _attr("torch._inductor.codecache:CppPythonBindingsCodeCache").load_pybinding
    return load


def bind_cpu_kernel(argtypes: Sequence[str], code: str) -> Callable[..., Any]:
    """Build C++ ``code`` defining ``extern "C" void kernel(...)`` and bind it to Python as
    Inductor binds its CPU kernels (``argtypes``: its parameters' C++ types; a pointer is passed
    a tensor)."""
    return _get("cpu_kernel_binding")(list(argtypes), code)
