"""Graph passes: the pipeline that runs them and the built-ins."""

from airstream.passes.manager import STAGES, PassManager, PassResult, PassSpec, pass_name
from airstream.passes.meta import check_meta, fill_meta

__all__ = [
    "STAGES",
    "PassManager",
    "PassResult",
    "PassSpec",
    "check_meta",
    "fill_meta",
    "pass_name",
]
