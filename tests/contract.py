"""The resume contract every stage passes: any saved state continues with exactly the same items.

``check_node_resume`` runs a node for several epochs, saving the state before every item, then
restores each saved state into a freshly built node and checks that the rest of that epoch and
the following epochs are identical. ``check_loader_resume`` does the same through
``pipe.loader()`` with states sent through ``pickle`` (as a checkpoint in a new process would be).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torchdata.nodes import BaseNode

from padpipe.chunks import TokenChunk


def normalize(item: Any) -> Any:
    """Turn a pipeline item (record batch, token chunk, dict of tensors) into comparable values."""
    if isinstance(item, (pa.RecordBatch, pa.Table)):
        return ("records", item.to_pylist())
    if isinstance(item, TokenChunk):
        rows = [item.row(i).tolist() for i in range(item.num_rows)]
        types = None if item.type_ids is None else item.type_ids.tolist()
        return ("tokens", rows, types, {k: v.to_pylist() for k, v in item.columns.items()})
    if isinstance(item, dict):
        return {k: normalize(v) for k, v in sorted(item.items())}
    if isinstance(item, torch.Tensor):
        return (str(item.dtype), tuple(item.shape), item.tolist())
    if isinstance(item, np.ndarray):
        return (str(item.dtype), item.tolist())
    if isinstance(item, (list, tuple)):
        return [normalize(v) for v in item]
    return item


def run_epochs(node: BaseNode, epochs: int) -> tuple[list[list[Any]], list[list[dict]]]:
    """Items of each epoch and the state before each item (plus the state after the last)."""
    items: list[list[Any]] = []
    states: list[list[dict]] = []
    for _ in range(epochs):
        node.reset(None)
        epoch_items, epoch_states = [], [pickle.loads(pickle.dumps(node.state_dict()))]
        for item in node:
            epoch_items.append(normalize(item))
            epoch_states.append(pickle.loads(pickle.dumps(node.state_dict())))
        items.append(epoch_items)
        states.append(epoch_states)
    return items, states


def check_node_resume(
    make_node: Callable[[], BaseNode],
    *,
    epochs: int = 2,
    steps: Sequence[int] | None = None,
    min_items: int = 2,
) -> list[list[Any]]:
    """Assert that resuming a fresh node from any saved state reproduces the uninterrupted run.

    Args:
        make_node: Builds a fresh node (same settings every call).
        epochs: Epochs in the reference run; resume is checked in each, then continued to the end.
        steps: Item positions to resume from (default: every position, including both ends).
        min_items: Fail if an epoch yields fewer items (a contract run on nothing proves nothing).

    Returns:
        The reference items, per epoch.
    """
    items, states = run_epochs(make_node(), epochs)
    for epoch, epoch_items in enumerate(items):
        assert len(epoch_items) >= min_items, f"epoch {epoch} yielded {len(epoch_items)} items"
    for epoch in range(epochs):
        positions = range(len(states[epoch])) if steps is None else [s for s in steps if s < len(states[epoch])]
        for k in positions:
            node = make_node()
            node.reset(states[epoch][k])
            rest = [normalize(x) for x in node]
            assert rest == items[epoch][k:], f"resume at epoch {epoch} step {k} differs"
            for later in range(epoch + 1, epochs):
                node.reset(None)
                again = [normalize(x) for x in node]
                assert again == items[later], f"epoch {later} after resuming at epoch {epoch} step {k} differs"
    return items


def check_loader_resume(make_loader: Callable[[], Any], *, epochs: int = 2, steps: Sequence[int] | None = None) -> None:
    """Assert that ``loader.load_state_dict(state)`` on a fresh loader continues exactly, as the ordinary loop.

    States are taken after every batch inside the loop (or at ``steps``) and after each epoch's
    loop ended, and sent through ``pickle``. A state from inside epoch ``e``'s loop resumes with
    the rest of epoch ``e`` (nothing, after its last batch), then the later epochs; a state from
    after the loop resumes with epoch ``e + 1``.
    """
    loader = make_loader()
    reference: list[list[Any]] = []
    inside: list[tuple[int, int, bytes]] = []  # (epoch, batches taken in it, state)
    after: list[bytes] = []
    for epoch in range(epochs):
        reference.append([])
        for batch in loader:
            reference[epoch].append(normalize(batch))
            inside.append((epoch, len(reference[epoch]), pickle.dumps(loader.state_dict())))
        after.append(pickle.dumps(loader.state_dict()))
    assert sum(map(len, reference)) >= 2, "the loader yielded fewer than 2 batches"
    positions = range(len(inside)) if steps is None else [s for s in steps if s < len(inside)]
    for k in positions:
        epoch, taken, state = inside[k]
        fresh = make_loader()
        fresh.load_state_dict(pickle.loads(state))
        assert [normalize(b) for b in fresh] == reference[epoch][taken:], (
            f"resume after batch {k}: rest of epoch {epoch}"
        )
        for later in range(epoch + 1, epochs):
            assert [normalize(b) for b in fresh] == reference[later], f"resume after batch {k}: epoch {later} differs"
    for epoch, state in enumerate(after[:-1]):
        fresh = make_loader()
        fresh.load_state_dict(pickle.loads(state))
        for later in range(epoch + 1, epochs):
            assert [normalize(b) for b in fresh] == reference[later], (
                f"resume after epoch {epoch}: epoch {later} differs"
            )
