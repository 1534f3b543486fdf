"""Private torch APIs of ``torch.distributed``'s traceable collectives: the functional
collectives and their ops, a process group written in Python, a group found by the name a
collective carries, and torch's fake process group (tests)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch

from airstream.torch_internals.core import OpOverload
from airstream.torch_internals.registry import _attr, _feature, _get

_COLLECTIVE_OPS = (
    "all_reduce",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "wait_tensor",
)


# --- collectives ------------------------------------------------------------------------------


@_feature(
    "functional_collectives",
    "torch.distributed._functional_collectives and the torch.ops._c10d_functional ops "
    + ", ".join(_COLLECTIVE_OPS),
    "collectives",
    "compiling torch.distributed collectives and the tensor-parallel benchmark",
)
def _probe_functional_collectives() -> Any:
    if not torch.distributed.is_available():
        raise RuntimeError("torch.distributed is not available in this torch build")
    namespace = torch.ops._c10d_functional
    for name in _COLLECTIVE_OPS:
        getattr(namespace, name).default  # noqa: B018 (resolving the op is the probe)
    module = importlib.import_module("torch.distributed._functional_collectives")
    for name in ("all_reduce", "all_gather_tensor", "reduce_scatter_tensor", "wait_tensor"):
        getattr(module, name)
    return module


def functional_collectives() -> Any:
    """``torch.distributed._functional_collectives`` (traceable collectives)."""
    return _get("functional_collectives")


@_feature(
    "python_process_group",
    "torch.distributed.ProcessGroup subclassed in Python (allreduce, alltoall_base returning a "
    "torch.distributed._Work), found by name through "
    "torch._C._distributed_c10d._register_process_group",
    "collectives",
    "airstream bench microbatch --comm modelled (communication as a modelled delay)",
)
def _probe_python_process_group() -> Any:
    if not torch.distributed.is_available():
        raise RuntimeError("torch.distributed is not available in this torch build")
    c10d = importlib.import_module("torch._C._distributed_c10d")
    return torch.distributed.ProcessGroup, torch.distributed._Work, c10d._register_process_group


def python_process_group() -> tuple[Any, Any, Callable[[str, Any], None]]:
    """``(ProcessGroup, Work, register(name, group))``: the base classes of a process group
    written in Python, and the call that lets functional collectives find it by ``name``."""
    found: tuple[Any, Any, Callable[[str, Any], None]] = _get("python_process_group")
    return found


def collective_op(name: str) -> OpOverload:
    """The aten-level op of a functional collective: ``collective_op("all_reduce")``."""
    _get("functional_collectives")
    return getattr(torch.ops._c10d_functional, name).default


@_feature(
    "process_group_by_name",
    "torch.distributed.distributed_c10d._resolve_process_group(group_name)",
    "collectives",
    "microbatch_overlap's ranks agreeing over the process group its collectives name",
)
def _probe_process_group_by_name() -> Callable[[str], Any]:
    if not torch.distributed.is_available():
        raise RuntimeError("torch.distributed is not available in this torch build")
    resolve: Callable[[str], Any] = _attr(
        "torch.distributed.distributed_c10d:_resolve_process_group"
    )
    return resolve


def process_group(name: str) -> Any:
    """The process group a functional collective names (its ``group_name`` argument)."""
    return _get("process_group_by_name")(name)


@_feature(
    "fake_process_group",
    "torch.testing._internal.distributed.fake_pg.FakeStore",
    "testing",
    "tests of collectives on torch's in-process fake process group",
)
def _probe_fake_process_group() -> type:
    return _attr("torch.testing._internal.distributed.fake_pg:FakeStore")


def fake_store() -> Any:
    """A store for ``dist.init_process_group("fake", ...)``."""
    return _get("fake_process_group")()
