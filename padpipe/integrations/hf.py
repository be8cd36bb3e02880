"""``padpipe.hf.Trainer`` (its face: :mod:`padpipe.hf`): Hugging Face's ``Trainer`` reading padpipe pipelines."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Any

import torch

from padpipe._optional import require
from padpipe.loader import PipelineLoader
from padpipe.pipeline import TENSORS, Pipeline

transformers = require("transformers", "padpipe.hf")

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, EvalLoopOutput  # noqa: E402

from padpipe.errors import check_bool  # noqa: E402
from padpipe.integrations.hf_epochs import EpochBatches, EpochPlan, epochs_of  # noqa: E402
from padpipe.integrations.hf_hooks import check_hooks, loss_shifts_labels, turn_off_unused_loss_kwargs  # noqa: E402
from padpipe.integrations.hf_packing import guard_columns  # noqa: E402
from padpipe.integrations.hf_parts import (  # noqa: E402  (the Trainer's batches, outputs and counts)
    EvalBatches,
    Outputs,
    column_filter,
    count_rows,
    count_steps,
    eval_metrics,
    evaluation_model,
    merge_outputs,
    rank_local_loss,
    rows_in,
)
from padpipe.integrations.hf_train import (  # noqa: E402
    Batch,
    PassLength,
    TrainBatches,
    counts_as_hf,
    loader_items,
    real_tokens,
)
from padpipe.runtime.rebalance import FILLER_KEY  # noqa: E402
from padpipe.sharing.ranks import all_ranks  # noqa: E402

check_hooks(transformers.Trainer, transformers.__version__)

logger = logging.getLogger(__name__)

LOADER_STATE = "padpipe_loader.pt"
"""The loader's state in a Trainer checkpoint folder: every rank's ``loader.checkpoint()`` and the pass read."""


class Trainer(transformers.Trainer):
    """``transformers.Trainer`` for padpipe pipelines: padded batches go to the model as they are.

    For a :class:`padpipe.Pipeline` as ``train_dataset``, ``eval_dataset`` (or a dict of them) or
    ``predict(test_dataset)``, batches come from ``pipe.loader()`` (``dataloader_num_workers``
    workers), sharded by padpipe, never collated again; anything else is ``Trainer``'s. Each pass is
    one epoch, trained as ``Trainer`` trains a sized loader (:mod:`padpipe.integrations.hf_epochs`);
    ranks take equal steps with every row once; columns ``forward`` does not take are removed; a
    packed pipeline's first batch is checked in the model (:mod:`padpipe.integrations.hf_packing`;
    ``check_packing=False`` turns it off); ``evaluate()``/``predict()`` read every row once, in row
    order where batches carry ``row_index``; checkpoints hold every rank's loader state
    (``padpipe_loader.pt``) for an exact resume. docs/training.md says each in full.

    Example:
        >>> from transformers import TrainingArguments  # doctest: +SKIP
        >>> trainer = Trainer(model=model, args=TrainingArguments("out", max_steps=200),  # doctest: +SKIP
        ...                   train_dataset=glue("mrpc", "train", tok, max_tokens=4096),
        ...                   eval_dataset=glue("mrpc", "validation", tok))
        >>> trainer.train()  # doctest: +SKIP
        >>> trainer.predict(trainer.eval_dataset).predictions.shape  # rows in split order  # doctest: +SKIP
        (408, 2)
    """

    def __init__(self, *args: Any, check_packing: bool = True, **kwargs: Any) -> None:
        check_bool("check_packing", check_packing)
        super().__init__(*args, **kwargs)
        self._check_packing = check_packing
        self._padpipe_train: TrainBatches | None = None
        self._rows_trained: int | None = None
        self._eval_steps: dict[str, int] = {}
        self._check_loss_kwargs = True
        self._unordered: dict[str, bool] = {}
        self._warned_order = False
        self._epochs: EpochPlan | None = None

    def _validate_args(self) -> None:
        """``Trainer``'s checks; a pipeline trains for ``num_train_epochs`` without ``max_steps`` too."""
        _refuse_loader("train_dataset", self.train_dataset)
        evals = self.eval_dataset if isinstance(self.eval_dataset, dict) else {"": self.eval_dataset}
        for name, dataset in evals.items():
            _refuse_loader(f"eval_dataset{f'[{name!r}]' if name else ''}", dataset)
        if not isinstance(self.train_dataset, Pipeline) or self.args.max_steps > 0:
            return super()._validate_args()
        epochs_of(self.args)
        dataset, self.train_dataset = self.train_dataset, None  # HF asks an iterable dataset for max_steps
        try:
            super()._validate_args()
        finally:
            self.train_dataset = dataset

    # -- loaders ----------------------------------------------------------------------------------
    def get_train_dataloader(self) -> Any:
        """``Trainer``'s loader, or for a pipeline its padpipe loader with unused columns removed."""
        if not isinstance(self.train_dataset, Pipeline):
            self._padpipe_train = None
            return super().get_train_dataloader()
        steps = self.args.gradient_accumulation_steps if counts_as_hf(self) else None  # the loader counts the windows
        loader = self._pipeline_loader(self.train_dataset, "train_dataset", equal_steps="balance", steps=steps)
        loader.keep_untrained(1)  # a checkpoint holds the batch read ahead to learn whether the pass ended
        pack = next((s.options for s in self.train_dataset.stages if s.name == "pack"), {})
        tokens = real_tokens(pack.get("pad_id"), pack.get("label_pad_id", -100))
        columns = column_filter(self, "training")
        if pack and self._check_packing:
            columns = guard_columns(self, columns)
        if self._epochs is not None:  # planned by an earlier train()
            self.remove_callback(self._epochs)
            self._epochs = None
        if self.args.max_steps > 0:
            self._padpipe_train = TrainBatches(loader, columns, tokens)
            return self._padpipe_train
        first = self._pipeline_loader(self.train_dataset, "train_dataset", equal_steps="balance")
        batches = sum(1 for _ in first)  # the first epoch's, on this rank
        self._epochs = EpochPlan(self, epochs_of(self.args), batches)
        self.add_callback(self._epochs)
        self._padpipe_train = EpochBatches(loader, columns, tokens, length=batches)
        return self._padpipe_train

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        """``Trainer``'s loader, or for a pipeline every row once with its ``row_index``."""
        dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        dataset = self.eval_dataset[dataset] if isinstance(dataset, str) else dataset
        _refuse_loader("eval_dataset", dataset)
        if not isinstance(dataset, Pipeline):
            return super().get_eval_dataloader(eval_dataset)
        loader = self._pipeline_loader(dataset, "eval_dataset", equal_steps="off")
        return EvalBatches(loader, column_filter(self, "evaluation"))

    def get_test_dataloader(self, test_dataset: Any) -> Any:
        """``Trainer``'s loader, or for a pipeline every row once with its ``row_index``."""
        _refuse_loader("test_dataset", test_dataset)
        if not isinstance(test_dataset, Pipeline):
            return super().get_test_dataloader(test_dataset)
        loader = self._pipeline_loader(test_dataset, "test_dataset", equal_steps="off")
        return EvalBatches(loader, column_filter(self, "test"))

    # -- training ---------------------------------------------------------------------------------
    def _init_training_state(
        self,
        max_steps: int,
        num_update_steps_per_epoch: int,
        num_train_epochs: int,
        resume_from_checkpoint: str | None,
        trial: Any,
    ) -> tuple[int, int]:
        """On resume, the loader continues from its saved state and epoch, so ``Trainer`` skips no batches."""
        epochs, steps = super()._init_training_state(
            max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
        )
        self._check_loss_kwargs = True
        if self._epochs is not None and resume_from_checkpoint is not None:
            self._epochs.load(resume_from_checkpoint)  # the schedule's total as refined before the checkpoint
            self.state.max_steps = self._epochs.total
        if self._padpipe_train is None or resume_from_checkpoint is None or self.args.ignore_data_skip:
            return epochs, steps
        path = os.path.join(resume_from_checkpoint, LOADER_STATE)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"Checkpoint {resume_from_checkpoint} has no padpipe loader state ({LOADER_STATE}): it was not saved "
                "by padpipe.hf.Trainer. Pass `TrainingArguments(ignore_data_skip=True)` to resume the model and start "
                "the data from the beginning."
            )
        # every saved rank's state: each rank picks its own, or on another number of ranks the rest of the
        # epoch is shared over the new ones (docs/elastic.md); states are plain data
        self._padpipe_train.load_state_dict(torch.load(path, weights_only=True))
        return self._padpipe_train.epoch, 0  # Trainer's epoch is the pass being read (the next, if it ended)

    def _run_epoch(self, **kwargs: Any) -> None:
        """One pass over a pipeline, each accumulation window (the last one short) with its own optimizer step."""
        if isinstance(kwargs["train_dataloader"], TrainBatches):
            kwargs["steps_in_epoch"] = PassLength(kwargs["steps_in_epoch"], kwargs["train_dataloader"])
        if self._epochs is not None:  # the data ends the epoch (get_batch_samples), not a step count
            kwargs["num_update_steps_per_epoch"] = sys.maxsize
        super()._run_epoch(**kwargs)

    def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
        """``Trainer``'s scheduler; for ``num_train_epochs`` on a pipeline, over the planned steps."""
        total = num_training_steps if self._epochs is None else self._epochs.total
        return super().create_scheduler(total, optimizer)

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> tuple[list, Any]:
        """``Trainer``'s; ends the epoch when the pass has ended, and on a pipeline's first window checks that a
        model taking ``**kwargs`` uses them."""
        batches, items = super().get_batch_samples(epoch_iterator, num_batches, device)
        if not batches and self._padpipe_train is not None:
            # the pass has ended: the next epoch begins (HF would turn its loop over the empty iterator until
            # a step count, max_steps for a loader without a length: 27 s at max_steps=10**7)
            self.control.should_epoch_stop = True
        if self._check_loss_kwargs and batches and isinstance(batches[0], Batch):
            self._check_loss_kwargs = False
            if turn_off_unused_loss_kwargs(self, batches[0]):
                items = self._get_num_items_in_batch(batches, device)
        return batches, items

    def _get_num_items_in_batch(self, batch_samples: list, device: Any) -> Any:
        """The loader's count of a pipeline's window (read ahead, summed over the ranks), else ``Trainer``'s."""
        items = loader_items(self, batch_samples, device)
        return items if items is not None else super()._get_num_items_in_batch(batch_samples, device)

    def compute_loss(
        self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        """``Trainer``'s, times 0 for a filler batch of equal steps (one real row where fewer rows were left
        than ranks, so that every rank takes the step): it trains nothing."""
        filler = inputs.pop(FILLER_KEY, None)
        result = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if filler is None or not bool(filler):
            return result
        return (result[0] * 0, *result[1:]) if isinstance(result, tuple) else result * 0

    def _track_num_input_tokens(self, inputs: Any) -> None:
        """A pipeline batch's real tokens, padded or packed, whether the setting is ``"all"`` or ``"non_padding"``."""
        if not isinstance(inputs, Batch) or self.args.include_num_input_tokens_seen == "no":
            return super()._track_num_input_tokens(inputs)
        tokens = torch.tensor(inputs.tokens, device=self.args.device, dtype=torch.int64)
        self.state.num_input_tokens_seen += int(self.accelerator.gather(tokens).sum().item())

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """``Trainer``'s checkpoint plus the loader's state in the same folder (a collective; saved with the model)."""
        if self._padpipe_train is not None:
            state = self._padpipe_train.state_dict()
            if self.args.should_save:
                folder = os.path.join(
                    self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
                )
                os.makedirs(folder, exist_ok=True)
                torch.save(state, os.path.join(folder, LOADER_STATE))
                if self._epochs is not None:
                    self._epochs.save(folder)
        super()._save_checkpoint(model, trial)

    def _finalize_training(self, trial: Any, num_train_samples: int, start_time: float) -> Any:
        if self._padpipe_train is not None:  # the rows trained on all ranks, for the train speed metrics
            rows = torch.tensor(self._padpipe_train.rows, device=self.args.device)
            self._rows_trained = int(self.accelerator.reduce(rows, reduction="sum").item())
        return super()._finalize_training(trial, num_train_samples, start_time)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """``Trainer.log``, with rows and batches counted for pipelines in the speed metrics."""
        if self._rows_trained is not None and "train_runtime" in logs:
            count_rows(logs, "train", self._rows_trained)
            self._rows_trained = None
        for prefix in [p for p in self._eval_steps if f"{p}_runtime" in logs]:
            count_steps(logs, prefix, self._eval_steps.pop(prefix))
        super().log(logs, start_time)

    # -- evaluation -------------------------------------------------------------------------------
    def predict(self, test_dataset: Any, ignore_keys: list[str] | None = None, metric_key_prefix: str = "test") -> Any:
        """``Trainer.predict``; for a pipeline, predictions and ``label_ids`` are in row order."""
        output = super().predict(test_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)
        if metric_key_prefix in self._eval_steps:
            count_steps(output.metrics, metric_key_prefix, self._eval_steps.pop(metric_key_prefix))
        if self._unordered.pop(metric_key_prefix, False) and not self._warned_order:
            self._warned_order = True
            warnings.warn(
                "predict() on a padpipe pipeline whose batches have no `row_index` column returns predictions and "
                "label_ids in the pipeline's batch order (grouped by length), not the rows' order: give each row its "
                "position as a `row_index` column (glue() evaluation and test splits have one) to get row order.",
                stacklevel=2,
            )
        return output

    def evaluation_loop(
        self,
        dataloader: Any,
        description: str,
        prediction_loss_only: bool | None = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
    ) -> EvalLoopOutput:
        """``Trainer``'s loop, or for a pipeline: each rank its share, gathered once, put in row order."""
        if not isinstance(dataloader, EvalBatches):
            return super().evaluation_loop(
                dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix
            )
        args = self.args
        if args.batch_eval_metrics:
            raise ValueError("`batch_eval_metrics` must be False to evaluate a padpipe pipeline, but is True instead.")
        if not args.eval_do_concat_batches:
            raise ValueError(
                "`eval_do_concat_batches` must be True to evaluate a padpipe pipeline (its outputs come "
                "back as arrays in row order), but is False instead."
            )
        if self.is_fsdp_enabled or self.is_deepspeed_enabled:
            raise NotImplementedError(
                "evaluate()/predict() on a padpipe pipeline run on one device or under DDP; FSDP and DeepSpeed need "
                "equal evaluation steps on every rank, which a pipeline's shares do not have."
            )
        if prediction_loss_only is None:
            prediction_loss_only = args.prediction_loss_only
        model = evaluation_model(self)
        logger.info(f"***** Running {description} on a padpipe pipeline *****")
        self.callback_handler.eval_dataloader = dataloader
        main_input = getattr(self.model, "main_input_name", "input_ids")
        keep = args.include_for_metrics
        outputs = Outputs(
            keep_inputs="inputs" in keep, keep_losses="loss" in keep, accumulate=args.eval_accumulation_steps
        )
        with rank_local_loss(args):
            for inputs, order in dataloader:
                wanted = inputs.get(main_input)
                loss, logits, labels = self.prediction_step(
                    model, inputs, prediction_loss_only, ignore_keys=ignore_keys
                )
                if logits is not None and self.preprocess_logits_for_metrics is not None:
                    logits = self.preprocess_logits_for_metrics(logits, labels)
                outputs.add(rows_in(inputs), order, loss, logits, labels, wanted)
                self.control = self.callback_handler.on_prediction_step(args, self.state, self.control)
        merged = merge_outputs(all_ranks(outputs.local()))
        self._eval_steps[metric_key_prefix] = merged["steps"]
        self._unordered[metric_key_prefix] = not merged["ordered"]
        metrics = eval_metrics(merged, args, self.compute_metrics, metric_key_prefix)
        if hasattr(self, "model_preparation_time"):
            metrics[f"{metric_key_prefix}_model_preparation_time"] = self.model_preparation_time
        return EvalLoopOutput(
            predictions=merged["preds"], label_ids=merged["labels"], metrics=metrics, num_samples=merged["rows"]
        )

    # -- internals --------------------------------------------------------------------------------
    def _pipeline_loader(self, pipe: Pipeline, name: str, *, equal_steps: str, steps: int | None = None) -> Any:
        if pipe.output != TENSORS:
            raise ValueError(
                f"`{name}` must be a pipeline that yields tensors (ending in .pad() or .pack()), but it yields "
                f"{pipe.output} instead."
            )
        args, options = self.args, {}
        if args.dataloader_num_workers > 0:
            options = {
                "num_workers": args.dataloader_num_workers,
                "pin_memory": args.dataloader_pin_memory and args.device.type == "cuda",
                "prefetch_factor": args.dataloader_prefetch_factor,
                "multiprocessing_context": args.dataloader_multiprocessing_context,
            }
        if steps is not None:  # num_items_in_batch of each window, as HF counts it
            options.update(accumulation_steps=steps, causal=loss_shifts_labels(self, transformers.__version__))
        return pipe.loader(equal_steps=equal_steps, **options)


def _refuse_loader(name: str, dataset: Any) -> None:
    """A ``pipe.loader()`` given as a dataset: ``Trainer`` would ask it for ``len`` and index it (``TypeError``)."""
    if isinstance(dataset, PipelineLoader):
        raise TypeError(
            f"padpipe.hf.Trainer: `{name}` is a PipelineLoader (pipe.loader()); pass the Pipeline itself "
            f"({name.split('[')[0]}=pipe): the Trainer makes its loader (workers, equal steps, checkpoints)."
        )
