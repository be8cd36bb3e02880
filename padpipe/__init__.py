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

from padpipe import examples
from padpipe._shard import Consumer
from padpipe._state import StateMismatchError
from padpipe.cache import TokenCache
from padpipe.chunks import TokenChunk
from padpipe.errors import DataError
from padpipe.inspection import InspectResult, inspect
from padpipe.loader import PipelineLoader
from padpipe.mix import mix
from padpipe.pipeline import Pipeline
from padpipe.pipes._retry import Retry
from padpipe.pipes.equal_steps import equal_steps
from padpipe.sources import from_hf, from_iterable, read_arrow, read_jsonl, read_parquet
from padpipe.stats import PipelineStats, StatsSnapshot

__all__ = [
    "Consumer",
    "DataError",
    "InspectResult",
    "Pipeline",
    "PipelineLoader",
    "PipelineStats",
    "Retry",
    "StateMismatchError",
    "StatsSnapshot",
    "TokenCache",
    "TokenChunk",
    "equal_steps",
    "examples",
    "from_hf",
    "from_iterable",
    "inspect",
    "mix",
    "read_arrow",
    "read_jsonl",
    "read_parquet",
]
__version__ = "0.1.0"
