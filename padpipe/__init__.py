"""padpipe: variable-length text to padded, bucketed or packed PyTorch batches at tokenizer speed.

Example:
    >>> import padpipe as pp
    >>> pipe = (pp.read_parquet(pp.examples.SAMPLE_PARQUET)
    ...           .shuffle(buffer_size=1000, seed=0)
    ...           .tokenize(pp.examples.tokenizer(), fields=("sentence1", "sentence2"), max_length=128)
    ...           .bucket(max_tokens=4096)
    ...           .pad(pad_to_multiple_of=8))
    >>> batch = next(iter(pipe.loader()))
    >>> sorted(batch)
    ['attention_mask', 'idx', 'input_ids', 'labels', 'token_type_ids']
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what editors and type checkers see; at run time each name loads on first use (below)
    from padpipe import examples
    from padpipe.cache import TokenCache
    from padpipe.chunks import TokenChunk
    from padpipe.errors import DataError
    from padpipe.inspection import InspectResult, inspect
    from padpipe.inspection.packing_check import PackingError, PackingReport, check_packing
    from padpipe.inspection.packing_model import ModelKind, model_kind
    from padpipe.loader import PipelineLoader
    from padpipe.mix import mix
    from padpipe.pipeline import Pipeline
    from padpipe.pipes.pairs import pair_logps
    from padpipe.readers.retry import Retry
    from padpipe.runtime.equal_steps import equal_steps
    from padpipe.runtime.marks import loss_weight
    from padpipe.sharing.consumer import Consumer
    from padpipe.sources import from_hf, from_iterable, read_arrow, read_csv, read_jsonl, read_parquet
    from padpipe.state import StateMismatchError
    from padpipe.stats import PipelineStats, StatsSnapshot

_MODULES = {
    "padpipe.cache": ("TokenCache",),
    "padpipe.chunks": ("TokenChunk",),
    "padpipe.errors": ("DataError",),
    "padpipe.inspection": ("InspectResult", "inspect"),
    "padpipe.inspection.packing_check": ("PackingError", "PackingReport", "check_packing"),
    "padpipe.inspection.packing_model": ("ModelKind", "model_kind"),
    "padpipe.loader": ("PipelineLoader",),
    "padpipe.mix": ("mix",),
    "padpipe.pipeline": ("Pipeline",),
    "padpipe.pipes.pairs": ("pair_logps",),
    "padpipe.readers.retry": ("Retry",),
    "padpipe.runtime.equal_steps": ("equal_steps",),
    "padpipe.runtime.marks": ("loss_weight",),
    "padpipe.sharing.consumer": ("Consumer",),
    "padpipe.sources": ("from_hf", "from_iterable", "read_arrow", "read_csv", "read_jsonl", "read_parquet"),
    "padpipe.state": ("StateMismatchError",),
    "padpipe.stats": ("PipelineStats", "StatsSnapshot"),
}
_HOMES = {name: home for home, names in _MODULES.items() for name in names}
"""Where each public name lives. They load on first use, so ``padpipe --help`` starts without torch."""

__all__ = [  # a literal list, as type checkers read a py.typed package's exports
    "Consumer", "DataError", "InspectResult", "ModelKind", "PackingError", "PackingReport", "Pipeline",
    "PipelineLoader", "PipelineStats", "Retry", "StateMismatchError", "StatsSnapshot", "TokenCache", "TokenChunk",
    "check_packing", "equal_steps", "examples", "from_hf", "from_iterable", "inspect", "loss_weight", "mix",
    "model_kind", "pair_logps", "read_arrow", "read_csv", "read_jsonl", "read_parquet",
]  # fmt: skip
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """Load a public name, or a submodule (``pp.examples``, ``pp.cache``), on first use, then keep it here."""
    if name in _HOMES:
        value: Any = getattr(importlib.import_module(_HOMES[name]), name)
    elif importlib.util.find_spec(f"padpipe.{name}") is not None:  # a submodule: pp.examples, pp.cache, pp.stats
        value = importlib.import_module(f"padpipe.{name}")
    else:
        raise AttributeError(f"module 'padpipe' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Face(types.ModuleType):
    """The package module: a submodule that shares a public name (``padpipe.mix``) never hides it."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _HOMES and isinstance(value, types.ModuleType):
            return  # the import system setting the submodule; pp.mix stays the function
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Face
