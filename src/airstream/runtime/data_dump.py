"""Data dump: run a graph node by node and save every aten op's tensor inputs and outputs.

Switch: ``debug.data_dump.type = "npy"`` (and ``debug.data_dump.path``, ``.filter``). For
accuracy debugging, as TorchAir's FX data dump: the graph runs serially in graph order (like
``debug.run_eagerly``; streams and max-autotune segments are ignored) and each call writes

    <path>/worldsize<W>_global_rank<R>/graph_<n>/<call>/<node>-<op>.INPUT.<i>[.<j>].<utc>.npy
                                                       <node>-<op>.OUTPUT.<i>.<utc>.npy

``n`` counts the graphs of the process, ``call`` the calls of this graph. ``filter(node)``
returns the node to dump or None to skip it. A path that is a file raises
``NotADirectoryError`` on the first call, from the OS.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import numpy as np
import torch
import torch.fx

from airstream.torch_internals import OpOverload

__all__ = ["DataDumpExecutor"]

_graph_ids = itertools.count()
_DUMPED_NAMESPACES = frozenset({"aten", "prims"})


def _as_numpy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        return (t.float() if t.dtype == torch.bfloat16 else t).numpy()
    try:
        return np.array(value)
    except Exception:
        return np.array(str(value))


def _world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


class _Dumper(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule, folder: str, keep: Callable[..., Any] | None):
        super().__init__(gm)
        self.folder = folder
        self.keep = keep

    def run_node(self, n: torch.fx.Node) -> Any:
        target = n.target
        wanted = (
            n.op == "call_function"
            and isinstance(target, OpOverload)
            and target.namespace in _DUMPED_NAMESPACES
            and (self.keep is None or self.keep(n) is not None)
        )
        if not wanted:
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        stamp = datetime.now(tz=UTC).strftime("%Y%m%d%H%M%S%f")
        base = os.path.join(self.folder, f"{n.name}-{target}")
        os.makedirs(self.folder, exist_ok=True)
        for i, arg in enumerate(args):
            if isinstance(arg, (list, tuple)) and arg and isinstance(arg[0], torch.Tensor):
                for j, t in enumerate(arg):
                    np.save(f"{base}.INPUT.{i}.{j}.{stamp}", _as_numpy(t))
            else:
                np.save(f"{base}.INPUT.{i}.{stamp}", _as_numpy(arg))
        result = getattr(self, n.op)(target, args, kwargs)
        for i, out in enumerate(result if isinstance(result, (list, tuple)) else [result]):
            np.save(f"{base}.OUTPUT.{i}.{stamp}", _as_numpy(out))
        return result


class DataDumpExecutor:
    """Boxed callable (AOTAutograd convention) that runs ``gm`` serially, dumping each op."""

    def __init__(
        self, gm: torch.fx.GraphModule, path: str, keep: Callable[..., Any] | None = None
    ) -> None:
        self._boxed_call = True
        self._gm = gm
        self._keep = keep
        world, rank = _world()
        self.folder = os.path.join(
            os.path.realpath(path),
            f"worldsize{world}_global_rank{rank}",
            f"graph_{next(_graph_ids)}",
        )
        self._calls = itertools.count()

    @property
    def code(self) -> str:
        """The graph's code (run by an FX interpreter, node by node)."""
        return self._gm.code

    def __call__(self, args: list[Any]) -> Any:
        inputs = list(args)
        args.clear()
        folder = os.path.join(self.folder, str(next(self._calls)))
        return _Dumper(self._gm, folder, self._keep).run(*inputs)
