"""torchtitan 0.3.0: pretrain from a padpipe pipeline; torchtitan checkpoints it, and it resumes on another DP degree.

:class:`PadpipeDataLoader` is a ``torchtitan.components.dataloader.BaseDataLoader`` yielding torchtitan's batch
from packed rows (:mod:`padpipe.integrations.titan_batches`); data belongs to the DP coordinate, every DP rank
ends at the same step, and its state resumes on another number of DP ranks
(:mod:`padpipe.integrations.titan_state`). What keeps documents apart: docs/torchtitan.md.

Example:
    >>> from padpipe.integrations.torchtitan import PadpipeDataLoader  # doctest: +SKIP
    >>> config = llama3_debugmodel()  # a torchtitan Trainer.Config  # doctest: +SKIP
    >>> config.dataloader = PadpipeDataLoader.Config(  # doctest: +SKIP
    ...     dataset_path="corpus/*.parquet", epochs=1, global_batch_size=config.training.global_batch_size)
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any

from padpipe._optional import MissingDependencyError
from padpipe.errors import positive
from padpipe.inspection.formats import read_corpus
from padpipe.integrations.titan_api import INSTALL, VERSION, check_api
from padpipe.integrations.titan_batches import TitanBatch, fill_rows, titan_batch
from padpipe.integrations.titan_state import STATE, data_parallel_group, packed, recipe, unpacked
from padpipe.integrations.titan_tokenizer import as_padpipe
from padpipe.pipeline import Pipeline
from padpipe.runtime.rebalance import FILLER_KEY
from padpipe.sharing.consumer import Consumer
from padpipe.sharing.ranks import ranks
from padpipe.state import StateMismatchError
from padpipe.tokenizer import TextEncoder

logger = logging.getLogger("padpipe.integrations.torchtitan")


def _need(module: str) -> None:
    """Import ``module``, or raise ``MissingDependencyError`` with the install line (torchtitan or what it imports)."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise MissingDependencyError(
            f"padpipe.integrations.torchtitan needs torchtitan {VERSION} and what it imports ({exc.name} is not "
            f"installed): {INSTALL}",
            name=exc.name,
        ) from None


for _module in ("dataloader", "checkpoint", "tokenizer", "loss"):
    _need(f"torchtitan.components.{_module}")
_need("tyro")
import tyro  # noqa: E402
from torchtitan import config as titan_config  # noqa: E402
from torchtitan.components import checkpoint, dataloader, loss, tokenizer  # noqa: E402
from torchtitan.components.dataloader import BaseDataLoader  # noqa: E402
from torchtitan.components.tokenizer import HuggingFaceTokenizer  # noqa: E402

check_api(dataloader, titan_config, loss, checkpoint, tokenizer)


def text_tokenizer(tokenizer: Any) -> Any:
    """torchtitan's tokenizer (a ``HuggingFaceTokenizer`` or its folder) as padpipe tokenizes with it: the same ids.

    See :func:`padpipe.integrations.titan_tokenizer.as_padpipe`.

    Example:
        >>> text_tokenizer(pp.examples.TOKENIZER_DIR).encode("hello world").ids == [2, 5668, 3422, 3]
        True
    """
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = HuggingFaceTokenizer(tokenizer_path=os.fspath(tokenizer))
    return as_padpipe(tokenizer)


class PadpipeDataLoader(BaseDataLoader):
    """A torchtitan data loader over a padpipe pipeline of packed rows (see the module docs).

    Built by torchtitan's trainer as ``config.build(dp_world_size=, dp_rank=, tokenizer=, seq_len=,
    local_batch_size=, snapshot_every_n_steps=)`` (not needed: the state is exact at every batch); a
    script may pass ``group=`` (the DP process group, or a 1-D device mesh of it), else it is found
    from every process's ``dp_rank``. Each ``iter()`` goes on from where the loader is;
    ``state_dict()`` is a collective over the DP group, and ``load_state_dict()`` takes a state saved
    on any number of DP ranks and workers.

    Attributes:
        loader: The ``pipe.loader()`` it reads (its ``stats()`` count rows, tokens, moves).
        recipe: What a state to load must have been saved with (:func:`padpipe.integrations.titan_state.recipe`).
        counts: Rows filled into short batches (``filled_rows``), equal steps' filler batches
            (``filler_batches``) and batches filling the last optimizer step (``end_batches``), in this process.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        """What to read: a corpus (``dataset_path``) or a pipeline of your own (``pipeline``); see the fields."""

        pipeline: Annotated[Callable[..., Pipeline] | None, tyro.conf.Suppress] = None
        """``pipeline(tokenizer=, seq_len=, batch_size=)`` -> a padpipe pipeline ending in ``.pack(seq_len,
        batch_size=batch_size)`` (``tokenizer`` is torchtitan's: :func:`text_tokenizer` reads it as torchtitan
        does). ``None``: read ``dataset_path`` (Parquet, Arrow, JSON Lines or CSV: a path, glob or folder)."""

        text_field: str = "text"
        """The column of each document's text (``dataset_path``)."""

        shuffle_buffer: int = 10_000
        """Documents in the shuffle buffer (``dataset_path``); the file order is shuffled per epoch too."""

        seed: int = 0
        """Seed of the file order and the shuffle (``dataset_path``)."""

        cache: str | None = None
        """A token cache folder or URL (``dataset_path``): later epochs and runs read ids instead of tokenizing."""

        num_workers: int = 0
        """Loader worker processes per rank (0: the stages run in the trainer's process, in threads)."""

        epochs: int | None = 1
        """Passes over the data; ``None``: endless (torchtitan's ``infinite``), until ``training.steps``."""

        global_batch_size: int = -1
        """torchtitan's ``training.global_batch_size`` (rows per optimizer step over all DP ranks): the data ends
        at a multiple of ``global_batch_size / (local_batch_size * dp_world_size)`` batches. ``-1``: one batch
        per optimizer step (torchtitan's default without pipeline parallelism)."""

        def __post_init__(self) -> None:
            if (self.pipeline is None) == (self.dataset_path is None):
                raise ValueError(
                    "PadpipeDataLoader.Config needs exactly one of `dataset_path` (files to read) and `pipeline` (a "
                    f"function returning a padpipe pipeline), but has dataset_path={self.dataset_path!r} and "
                    f"pipeline={self.pipeline!r}."
                )
            positive("shuffle_buffer", self.shuffle_buffer)
            positive("epochs", self.epochs, allow_none=True)
            if self.num_workers < 0 or (self.global_batch_size < 1 and self.global_batch_size != -1):
                raise ValueError(
                    f"PadpipeDataLoader.Config: `num_workers` must be >= 0 and `global_batch_size` -1 or >= 1, but are "
                    f"{self.num_workers} and {self.global_batch_size} instead."
                )

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        tokenizer: Any,
        seq_len: int,
        local_batch_size: int,
        snapshot_every_n_steps: int | None = None,
        group: Any = None,
    ) -> None:
        positive("dp_world_size", dp_world_size)
        positive("seq_len", seq_len)
        positive("local_batch_size", local_batch_size)
        Consumer(rank=dp_rank, world_size=dp_world_size)  # checks dp_rank
        self.config, self.seq_len, self.rows = config, seq_len, local_batch_size
        self.batches_per_step = _batches_per_step(config.global_batch_size, local_batch_size, dp_world_size)
        make = config.pipeline or functools.partial(_text_pipeline, config)
        pipe = make(tokenizer=tokenizer, seq_len=seq_len, batch_size=local_batch_size)
        self.pad_id = _pack_pad_id(pipe, seq_len, local_batch_size)
        self.recipe = recipe(pipe, seq_len)  # what a state to load must have been read with, checked at once
        self.group, consumer = _data_parallel(group, dp_rank, dp_world_size)
        self.loader = pipe.loader(config.num_workers, consumer=consumer, group=self.group)
        self.counts = {"filled_rows": 0, "filler_batches": 0, "end_batches": 0}
        self._yielded = self._epochs = 0
        self._resumed = False

    def __iter__(self) -> Iterator[TitanBatch]:
        """torchtitan's batches until the data ends (then ``StopIteration``), from where the loader is."""
        epochs, resumed = self.config.epochs, self._resumed
        self._resumed = False
        while epochs is None or self._epochs < epochs:
            empty = True
            for batch in self.loader:
                empty = False
                converted, filled = titan_batch(batch, rows=self.rows, seq_len=self.seq_len, pad_id=self.pad_id)
                self.counts["filled_rows"] += filled
                self.counts["filler_batches"] += int(bool(batch.get(FILLER_KEY, False)))
                self._yielded += 1
                yield converted
            self._epochs += 1
            if empty and epochs is None and not resumed:
                raise ValueError(
                    "PadpipeDataLoader: an epoch of the pipeline has no batch, so endless epochs never end."
                )
            resumed = False
        while self._yielded % self.batches_per_step:  # the last optimizer step, filled with batches that train nothing
            self._yielded += 1
            self.counts["end_batches"] += 1
            yield fill_rows(self.rows, self.seq_len, self.pad_id)
        logger.info("PadpipeDataLoader: the data ended after %d epochs; %s", self._epochs, self.counts)

    def state_dict(self) -> dict[str, Any]:
        """Every DP rank's position (``loader.checkpoint()``) and this loader's counts, in one value the same on every
        rank (a collective over the DP group): :mod:`padpipe.integrations.titan_state`."""
        counts = dict(yielded=self._yielded, batches_per_step=self.batches_per_step, epochs=self._epochs)
        # torchtitan trains each batch before it asks for the next: nothing fetched ahead
        return packed(STATE.make(self.recipe, checkpoint=self.loader.checkpoint(), **counts))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Go on from ``state_dict`` (saved on any number of DP ranks and workers) at the next ``iter()``.

        Raises ``StateMismatchError`` at once (inside torchtitan's ``CheckpointManager.load``) for a state of
        another dataset, tokenizer or ``seq_len``; the rest of the pipeline's settings are checked at the first batch.
        """
        saved = unpacked(state_dict, self.recipe)
        yielded, steps = saved.yielded, saved.batches_per_step
        if steps != self.batches_per_step and yielded % steps:
            raise StateMismatchError(
                f"PadpipeDataLoader state was saved inside an optimizer step ({yielded} batches at {steps} a step), "
                f"and this run takes {self.batches_per_step} a step: resume from a checkpoint torchtitan saved."
            )
        self.loader.load_state_dict(saved.checkpoint)
        self._yielded = yielded if steps == self.batches_per_step else 0
        self._epochs, self._resumed = saved.epochs, True


def _batches_per_step(global_batch_size: int, rows: int, dp_world_size: int) -> int:
    if global_batch_size == -1:
        return 1
    if global_batch_size % (rows * dp_world_size):
        raise ValueError(
            f"PadpipeDataLoader: `global_batch_size` must be a multiple of local_batch_size x dp_world_size = "
            f"{rows} x {dp_world_size}, but is {global_batch_size} instead."
        )
    return global_batch_size // (rows * dp_world_size)


def _text_pipeline(config: Any, *, tokenizer: Any, seq_len: int, batch_size: int) -> Pipeline:
    """``dataset_path``'s documents, shuffled, tokenized as torchtitan does, packed into rows of ``seq_len``."""
    rust = text_tokenizer(tokenizer)
    encoder = TextEncoder.load(rust, max_length=None, truncation=False, add_special_tokens=True)
    pad_id = next((i for i in (encoder.pad_id, encoder.eos_id, getattr(tokenizer, "eos_id", None)) if i is not None), 0)
    pipe = read_corpus([config.dataset_path], columns=[config.text_field]).shuffle(
        config.shuffle_buffer, seed=config.seed
    )
    pipe = pipe.tokenize(rust, fields=config.text_field, truncation=False, cache=config.cache)
    return pipe.pack(seq_len, batch_size=batch_size, long_docs="split", pad_id=pad_id)


def _pack_pad_id(pipe: Any, seq_len: int, rows: int) -> int:
    """The pad id of ``pipe``'s last stage, checked to be ``.pack(seq_len, batch_size=rows)`` as torchtitan reads."""
    stages = list(getattr(pipe, "stages", ()))
    while stages and stages[-1].name == "prefetch":
        stages.pop()
    pack = stages[-1].options if isinstance(pipe, Pipeline) and stages and stages[-1].name == "pack" else None
    wanted = {"seq_len": seq_len, "batch_size": rows, "position_offset": 0, "block_mask": False, "layout": "rows"}
    if pack is None or any(pack[key] != value for key, value in wanted.items()):
        found = "no .pack() last" if pack is None else ", ".join(f"{k}={pack[k]!r}" for k in wanted)
        raise ValueError(
            f"PadpipeDataLoader needs a padpipe pipeline ending in .pack({seq_len}, batch_size={rows}) (torchtitan's "
            f"seq_len and local_batch_size; position_offset=0, no block_mask: torchtitan builds its own masks; "
            f"layout='rows'), but "
            f"found {found}."
        )
    return int(pack["pad_id"])


def _data_parallel(group: Any, dp_rank: int, dp_world_size: int) -> tuple[Any, Consumer | None]:
    """The DP group to read, agree and save in, or (no ``torch.distributed``) the consumer of ``dp_rank``."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise ValueError("PadpipeDataLoader: a `group` was given, but torch.distributed is not initialized.")
        return None, Consumer(rank=dp_rank, world_size=dp_world_size)
    if group is None:
        group = data_parallel_group(dp_rank, dp_world_size)
    elif isinstance(group, DeviceMesh):
        if group.ndim != 1:
            raise ValueError(
                f"PadpipeDataLoader: `group` must be a 1-D device mesh (the DP dimension), but has {group.ndim}."
            )
        group = group.get_group()
    if ranks(group) != (dp_rank, dp_world_size):
        raise ValueError(
            f"PadpipeDataLoader: this process is rank {ranks(group)[0]} of {ranks(group)[1]} in the DP group, but "
            f"was built as dp_rank {dp_rank} of {dp_world_size}."
        )
    return group, None
