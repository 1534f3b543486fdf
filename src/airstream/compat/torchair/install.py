"""Make an unmodified TorchAir script run here: ``import torchair`` / ``import torch_npu`` resolve
to airstream's compat surface, and ``.npu()`` / ``torch.npu`` / ``device="npu"`` map to CUDA when
present, else CPU. Nothing is changed when a real ``torch_npu`` is importable."""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["alias_torchair", "install", "installed_device", "uninstall"]

_state: dict[str, Any] = {}


def _real_torch_npu() -> bool:
    if "torch_npu" in sys.modules:
        return not getattr(sys.modules["torch_npu"], "_airstream_shim", False)
    return importlib.util.find_spec("torch_npu") is not None


def _map(device: Any, target: str) -> Any:
    if isinstance(device, str) and device.startswith("npu"):
        return device.replace("npu", target, 1) if target == "cuda" else "cpu"
    if isinstance(device, torch.device) and device.type == "npu":
        return target
    return device


class _NpuDeviceMode(TorchFunctionMode):
    """Rewrites ``device="npu"`` arguments (factories, ``.to``) to the chosen device."""

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if getattr(func, "__name__", None) == "record_stream" and self.target == "cpu":
            return None  # a CPU tensor lives as long as it is referenced: nothing to record
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = _map(kwargs["device"], self.target)
        args = tuple(_map(a, self.target) for a in args)
        return func(*args, **kwargs)


class _NpuEvent:
    """``torch.npu.Event()`` on a CPU: a ``torch.Event`` whose ``record()`` and ``wait()``
    without a stream mean the current ``torch.npu.stream`` block's stream (or the main stream),
    passed explicitly, because Dynamo knows no current stream on a machine without an
    accelerator. Eagerly (and after a graph break) its calls do nothing: CPU work runs in
    program order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.event = torch.Event(device="cpu")

    def record(self, stream: Any = None) -> None:
        if torch.compiler.is_compiling():
            self.event.record(stream if stream is not None else _cpu_current_stream())

    def wait(self, stream: Any = None) -> None:
        if torch.compiler.is_compiling():
            self.event.wait(stream if stream is not None else _cpu_current_stream())

    def synchronize(self) -> None:
        if torch.compiler.is_compiling():
            self.event.synchronize()

    def query(self) -> bool:
        return True


_cpu_streams: list[Any] = []  # the torch.npu.stream blocks entered, innermost last


def _cpu_current_stream(*args: Any, **kwargs: Any) -> Any:
    from airstream.ops.torch_streams import current_stream

    return _cpu_streams[-1] if _cpu_streams else current_stream("cpu")


def _cpu_new_stream(*args: Any, **kwargs: Any) -> Any:
    """``torch.npu.Stream()``: a ``torch.Stream`` on the CPU (in compiled code one Dynamo
    traces; eagerly one whose ordering calls work in eager code)."""
    if torch.compiler.is_compiling():
        return torch.Stream(device="cpu")
    from airstream.ops.torch_streams import CpuStream

    return CpuStream()


@contextlib.contextmanager
def _cpu_stream(stream: Any = None) -> Iterator[Any]:
    """``with torch.npu.stream(s):``: ``with s:`` (the block Dynamo records), remembered as the
    current stream for events recorded without one."""
    if stream is None:
        yield None
        return
    _cpu_streams.append(stream)
    try:
        with stream:
            yield stream
    finally:
        _cpu_streams.pop()


def _cpu_set_stream(stream: Any) -> None:
    if _cpu_streams:
        _cpu_streams[-1] = stream


def _npu_namespace(target: str) -> types.SimpleNamespace:
    cuda = target == "cuda"

    def _noop(*args: Any, **kwargs: Any) -> None:
        return None

    def _default_stream(*args: Any, **kwargs: Any) -> Any:
        from airstream.ops.torch_streams import current_stream

        return current_stream("cpu")

    from airstream.compat.torchair import npugraph_ex

    return types.SimpleNamespace(
        npugraph_ex=npugraph_ex,
        is_available=lambda: True,
        device_count=(torch.cuda.device_count if cuda else (lambda: 1)),
        synchronize=(torch.cuda.synchronize if cuda else _noop),
        set_device=(torch.cuda.set_device if cuda else _noop),
        current_device=(torch.cuda.current_device if cuda else (lambda: 0)),
        current_stream=(torch.cuda.current_stream if cuda else _cpu_current_stream),
        default_stream=(torch.cuda.default_stream if cuda else _default_stream),
        stream=(torch.cuda.stream if cuda else _cpu_stream),
        set_stream=(torch.cuda.set_stream if cuda else _cpu_set_stream),
        Stream=(torch.cuda.Stream if cuda else _cpu_new_stream),
        Event=(torch.cuda.Event if cuda else _NpuEvent),
        manual_seed=(torch.cuda.manual_seed if cuda else torch.manual_seed),
        manual_seed_all=(torch.cuda.manual_seed_all if cuda else torch.manual_seed),
        empty_cache=(torch.cuda.empty_cache if cuda else _noop),
    )


def _register_npu_backend(compat: Any) -> None:
    """``torch.compile(backend="npu")``: torch_npu registers TorchAir's default backend so;
    ``backend="npugraph_ex"``: TorchAir's npugraph_ex package, its graph-capture mode, with its
    ``torch.ops.npugraph_ex`` names for the air ops."""
    from airstream import torch_internals

    torch_internals.register_backend("npu", compat.get_npu_backend())
    npugraph_ex = compat.CompilerConfig()
    npugraph_ex.mode.value = "npugraph_ex"
    torch_internals.register_backend("npugraph_ex", compat.get_npu_backend(npugraph_ex))
    compat.ops.define_npugraph_ex_ops()


def installed_device() -> str | None:
    """The device ``npu`` maps to, or None when nothing was installed."""
    return _state.get("device")


def _torchair_modules() -> dict[str, types.ModuleType]:
    """``{module name: module}`` that make ``import torchair`` (and its submodules) resolve
    to this package."""
    from airstream.compat import torchair as compat

    configs = types.ModuleType("torchair.configs")
    compiler_config = types.ModuleType("torchair.configs.compiler_config")
    compiler_config.CompilerConfig = compat.CompilerConfig  # type: ignore[attr-defined]
    configs.compiler_config = compiler_config  # type: ignore[attr-defined]
    return {
        "torchair": compat,
        "torchair.scope": compat.scope,
        "torchair.ops": compat.ops,
        "torchair.inference": compat.inference,
        "torchair.inference._cache_compiler": compat.cache,
        "torchair.configs": configs,
        "torchair.configs.compiler_config": compiler_config,
        "torchair.core": compat.core,
        "torchair.core.utils": compat.core.utils,
    }


def alias_torchair() -> None:
    """Only make ``import torchair`` resolve here (no torch_npu, no ``torch.npu``): for code
    that shares its process with code that must not see an NPU stand-in (a test suite)."""
    for name, module in _torchair_modules().items():
        sys.modules.setdefault(name, module)


def _torch_npu_shim(target: str) -> tuple[types.ModuleType, dict[str, types.ModuleType]]:
    from airstream.compat import torchair as compat

    shim = types.ModuleType("torch_npu")
    # a spec, so importlib.util.find_spec("torch_npu") answers instead of raising
    shim.__spec__ = importlib.machinery.ModuleSpec("torch_npu", None)
    shim._airstream_shim = True  # type: ignore[attr-defined]
    shim.npu = _npu_namespace(target)  # type: ignore[attr-defined]
    shim.profiler = compat.npu_profiler  # type: ignore[attr-defined]
    # NPU memory formats do not exist here: a format cast keeps the layout (a copy, as a cast)
    shim.npu_format_cast = lambda t, *a, **k: t.clone()  # type: ignore[attr-defined]
    return shim, {"torch_npu": shim, "torch_npu.profiler": compat.npu_profiler}


def install(verbose: bool = True, *, device_mode: bool = True) -> bool:
    """Install the shims; return False (and change nothing) when a real torch_npu exists.

    ``device_mode=False`` leaves out the torch function mode that rewrites ``device="npu"``
    arguments on this thread. :func:`uninstall` takes everything back."""
    if "device" in _state:
        return True
    if _real_torch_npu():
        if verbose:
            print("airstream: a real torch_npu is importable; running the script on the NPU")
        return False
    from airstream import torch_internals
    from airstream.compat import torchair as compat

    torch_internals.require("torchair")
    target = "cuda" if torch.cuda.is_available() else "cpu"
    shim, shim_modules = _torch_npu_shim(target)
    modules = {**shim_modules, **_torchair_modules()}
    saved_modules = {name: sys.modules.get(name) for name in modules}
    saved_attrs = {
        (owner, name): getattr(owner, name, None)
        for owner, name in ((torch, "npu"), (torch.Tensor, "npu"), (torch.nn.Module, "npu"))
    }
    sys.modules.update(modules)
    torch.npu = shim.npu  # type: ignore[attr-defined]
    torch.Tensor.npu = lambda self, *a, **k: self.to(target)  # type: ignore[attr-defined]
    torch.nn.Module.npu = lambda self, *a, **k: self.to(target)  # type: ignore[attr-defined]
    _register_npu_backend(compat)
    mode = _NpuDeviceMode(target) if device_mode else None
    if mode is not None:
        mode.__enter__()  # for the rest of the process, on this thread
    _state.update(device=target, mode=mode, modules=saved_modules, attrs=saved_attrs)
    if verbose:
        print(
            f"airstream: no torch_npu here; running TorchAir code on {target} "
            "(.npu(), torch.npu and device='npu' map to it)"
        )
    return True


def uninstall() -> None:
    """Take back what :func:`install` did (the ``npu`` backend name stays registered)."""
    if "device" not in _state:
        return
    mode = _state["mode"]
    if mode is not None:
        mode.__exit__(None, None, None)
    for name, module in _state["modules"].items():
        if module is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = module
    for (owner, name), value in _state["attrs"].items():
        if value is None:
            if hasattr(owner, name):
                delattr(owner, name)
        else:
            setattr(owner, name, value)
    _state.clear()
