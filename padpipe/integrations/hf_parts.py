"""The parts of ``padpipe.hf.Trainer`` that are not Trainer hooks: batches, outputs in row order, counts."""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import transformers
from transformers.trainer_pt_utils import EvalLoopContainer, find_batch_size, nested_concat
from transformers.trainer_utils import EvalPrediction, denumpify_detensorize

from padpipe.integrations.hf_hooks import private

logger = logging.getLogger("padpipe.hf")

ROW_INDEX = "row_index"
"""The column of evaluation batches giving each row's position in its split (as ``glue()`` makes)."""
FLASH_ATTENTION_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx", "use_cache")
"""Packed-batch columns kept for a model whose ``forward`` takes ``**kwargs`` (HF's flash-attention and varlen kernel
names: the boundaries its attention, convolution and recurrent layers read; and the batch's ``use_cache=False``)."""


class EvalBatches:
    """Evaluation batches as ``(model inputs, row_index or None)``."""

    def __init__(self, loader: Any, columns: Callable[[dict], dict]) -> None:
        self.loader, self._columns = loader, columns

    def __iter__(self) -> Iterator[tuple[dict, Any]]:
        for batch in self.loader:
            order = batch.get(ROW_INDEX)
            yield self._columns({k: v for k, v in batch.items() if k != ROW_INDEX}), order


class Outputs:
    """One rank's evaluation results: arrays in its batch order (moved off the device every
    ``eval_accumulation_steps`` batches, as ``Trainer.evaluation_loop`` does), the loss summed over rows."""

    def __init__(self, *, keep_inputs: bool, keep_losses: bool, accumulate: int | None) -> None:
        self.keep_inputs, self.keep_losses, self.accumulate = keep_inputs, keep_losses, accumulate
        self.rows = self.steps = 0
        self.losses_rows: list[tuple[float, int]] = []  # each batch's loss and rows
        self.order: list[np.ndarray] = []
        self.preds, self.labels, self.inputs, self.losses = (EvalLoopContainer(padding_index=-100) for _ in range(4))

    def add(self, rows: int, order: Any, loss: Any, logits: Any, labels: Any, inputs: Any) -> None:
        self.steps += 1
        self.rows += rows
        if order is not None:
            self.order.append(np.asarray(order, dtype=np.int64))
        per_row = None
        if loss is not None:
            self.losses_rows.append((float(loss), rows))
            per_row = loss.detach().reshape(1).repeat(rows) if self.keep_losses else None
        containers = (self.preds, self.labels, self.inputs, self.losses)
        for container, value in zip(containers, (logits, labels, inputs if self.keep_inputs else None, per_row)):
            if value is not None:
                container.add(value)
        if self.accumulate is not None and self.steps % self.accumulate == 0:
            for container in containers:
                container.to_cpu_and_numpy()

    def local(self) -> dict[str, Any]:
        ordered = len(self.order) == self.steps and self.steps > 0
        return {
            "rows": self.rows,
            "steps": self.steps,
            "losses_rows": np.array(self.losses_rows, dtype=np.float64).reshape(-1, 2),
            "order": np.concatenate(self.order) if ordered else None,
            "ordered": ordered or self.steps == 0,
            "preds": self.preds.get_arrays(),
            "labels": self.labels.get_arrays(),
            "inputs": self.inputs.get_arrays(),
            "losses": self.losses.get_arrays(),
        }


def eval_metrics(merged: dict[str, Any], args: Any, compute_metrics: Callable | None, prefix: str) -> dict[str, Any]:
    """``compute_metrics`` of the merged outputs, the loss over rows (with ``logging_nan_inf_filter``, over the
    batches of finite loss where there are any, as ``Trainer`` does) and the row count, keys prefixed."""
    metrics: dict[str, Any] = {}
    if compute_metrics is not None and merged["preds"] is not None and merged["labels"] is not None:
        extra = {
            "losses": merged["losses"] if "loss" in args.include_for_metrics else None,
            "inputs": merged["inputs"] if "inputs" in args.include_for_metrics else None,
        }
        metrics = compute_metrics(EvalPrediction(predictions=merged["preds"], label_ids=merged["labels"], **extra))
    metrics = denumpify_detensorize(metrics)
    loss, rows = merged["losses_rows"].T
    kept = np.isfinite(loss) if args.logging_nan_inf_filter and rows[np.isfinite(loss)].sum() else rows > 0
    if rows[kept].sum():
        metrics["loss"] = float((loss * rows)[kept].sum() / rows[kept].sum())
    metrics["samples"] = merged["rows"]
    return {k if k.startswith(f"{prefix}_") else f"{prefix}_{k}": v for k, v in metrics.items()}


@contextlib.contextmanager
def rank_local_loss(args: Any) -> Iterator[None]:
    """Each batch's loss from this rank alone: ranks take different numbers of evaluation steps, and
    ``average_tokens_across_devices`` would gather token counts across ranks at every step."""
    saved = args.average_tokens_across_devices
    args.average_tokens_across_devices = False
    try:
        yield
    finally:
        args.average_tokens_across_devices = saved


def evaluation_model(trainer: transformers.Trainer) -> Any:
    """The model as ``Trainer.evaluation_loop`` prepares it (not DDP-wrapped: no collectives)."""
    model = trainer._wrap_model(trainer.model, training=False)
    if len(private(trainer.accelerator, "_models")) == 0 and model is trainer.model:
        model = trainer.accelerator.prepare_model(model, evaluation_mode=True)
        if model is not trainer.model:
            trainer.model_wrapped = model
    if not trainer.is_in_train and (trainer.args.fp16_full_eval or trainer.args.bf16_full_eval):
        dtype = torch.float16 if trainer.args.fp16_full_eval else torch.bfloat16
        model = model.to(dtype=dtype, device=trainer.args.device)
    model.eval()
    if callable(getattr(trainer.optimizer, "eval", None)):
        trainer.optimizer.eval()
    return model


def merge_outputs(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """All ranks' results in rank order, then sorted by ``row_index`` when every batch had one."""
    merged = {"rows": sum(p["rows"] for p in parts), "steps": max(p["steps"] for p in parts)}
    merged["losses_rows"] = np.concatenate([p["losses_rows"] for p in parts])
    for key in ("preds", "labels", "inputs", "losses"):
        arrays = [p[key] for p in parts if p[key] is not None]
        merged[key] = None
        for array in arrays:
            merged[key] = array if merged[key] is None else nested_concat(merged[key], array, padding_index=-100)
    merged["ordered"] = all(p["ordered"] for p in parts)
    if merged["ordered"] and merged["rows"]:
        order = np.argsort(np.concatenate([p["order"] for p in parts if p["order"] is not None]), kind="stable")
        for key in ("preds", "labels", "inputs", "losses"):
            merged[key] = _take(merged[key], order)
    return merged


def _take(arrays: Any, order: np.ndarray) -> Any:
    if arrays is None:
        return None
    if isinstance(arrays, (list, tuple)):
        return type(arrays)(_take(a, order) for a in arrays)
    if isinstance(arrays, dict):
        return {k: _take(v, order) for k, v in arrays.items()}
    return arrays[order]


def rows_in(batch: dict) -> int:
    ids = batch.get("input_ids")
    if isinstance(ids, torch.Tensor):
        return int(ids.shape[0])
    return int(find_batch_size(batch) or 0)


def column_filter(trainer: transformers.Trainer, description: str) -> Callable[[dict], dict]:
    """Keep what ``model.forward`` takes (as ``remove_unused_columns`` does); log the rest once."""
    if not trainer.args.remove_unused_columns:
        return dict
    trainer._set_signature_columns_if_needed()
    keep = set(private(trainer, "_signature_columns"))
    forward = inspect.signature(trainer.model.forward).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in forward):
        keep.update(FLASH_ATTENTION_KWARGS)
    logged = False

    def select(batch: dict) -> dict:
        nonlocal logged
        if not logged:
            logged = True
            dropped = [k for k in batch if k not in keep]
            if dropped:
                logger.info(
                    f"Columns of the {description} pipeline that `{type(trainer.model).__name__}.forward` does "
                    f"not take are removed: {', '.join(dropped)}."
                )
        return {k: v for k, v in batch.items() if k in keep}

    return select


def count_rows(metrics: dict[str, Any], prefix: str, rows: int) -> None:
    metrics[f"{prefix}_samples"] = rows
    runtime = metrics.get(f"{prefix}_runtime")
    if runtime:
        metrics[f"{prefix}_samples_per_second"] = round(rows / runtime, 3)


def count_steps(metrics: dict[str, Any], prefix: str, steps: int) -> None:
    runtime = metrics.get(f"{prefix}_runtime")
    if runtime:
        metrics[f"{prefix}_steps_per_second"] = round(steps / runtime, 3)
