"""FixedBatcher: exact batches in arrival order across chunk borders, drop_last, exact resume."""

from __future__ import annotations

import pytest

from padpipe.chunks import TokenChunk
from padpipe.pipes.batch import FixedBatcher
from padpipe.stats import PipelineStats
from tests.contract import check_node_resume
from tests.pipes.nodes import ListNode, check_rows, token_chunks

LENGTHS = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2]  # 17 rows


def run(chunks: list[TokenChunk], **kwargs) -> list[TokenChunk]:
    node = FixedBatcher(ListNode(chunks), **kwargs)
    node.reset(None)
    return list(node)


def test_batch_works() -> None:
    batches = run(token_chunks(LENGTHS, 5, type_ids=True), batch_size=4, drop_last=False)
    assert [check_rows(b) for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15], [16]]
    assert [b.lengths.tolist() for b in batches][0] == [3, 1, 4, 1]
    assert batches[0].type_ids is not None and batches[0].type_ids.tolist() == [0, 1, 0, 0, 0, 1, 0, 1, 0]


def test_batch_works_when_chunks_are_smaller_than_a_batch() -> None:
    batches = run(token_chunks(LENGTHS, 2), batch_size=7, drop_last=False)
    assert [check_rows(b) for b in batches] == [list(range(0, 7)), list(range(7, 14)), [14, 15, 16]]


def test_batch_works_with_drop_last() -> None:
    stats = PipelineStats()
    batches = run(token_chunks(LENGTHS, 3), batch_size=4, drop_last=True, stats=stats)
    assert [check_rows(b) for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert stats.snapshot().skipped == {"batch.drop_last": 1}


def test_batch_works_when_rows_fill_batches_exactly() -> None:
    stats = PipelineStats()
    batches = run(token_chunks(LENGTHS[:16], 8), batch_size=4, drop_last=True, stats=stats)
    assert [len(check_rows(b)) for b in batches] == [4, 4, 4, 4]
    assert stats.snapshot().skipped == {}


def test_batch_works_on_empty_input() -> None:
    assert run([], batch_size=4) == []
    assert run([TokenChunk.empty()], batch_size=4) == []


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"batch_size": 0}, ValueError, r"^`batch_size` must be greater than zero, but is 0 instead\.$"),
        ({"batch_size": 2.0}, TypeError, r"^`batch_size` must be an int, but is 2\.0 of type float instead\.$"),
        ({"batch_size": 2, "drop_last": 1}, TypeError, r"^`drop_last` must be a bool, but is 1 instead\.$"),
    ],
)
def test_batch_raises_error_when_an_argument_is_bad(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        FixedBatcher(ListNode([]), **kwargs)


@pytest.mark.parametrize(("chunk_rows", "batch_size", "drop_last"), [(5, 4, False), (2, 3, True), (17, 17, False)])
def test_batch_saves_and_restores_its_state(chunk_rows: int, batch_size: int, drop_last: bool) -> None:
    items = check_node_resume(
        lambda: FixedBatcher(
            ListNode(token_chunks(LENGTHS * 2, chunk_rows)), batch_size=batch_size, drop_last=drop_last
        ),
        min_items=1,
    )
    rows = [r for _, _, _, cols in items[0] for r in cols["rid"]]
    expected = len(LENGTHS) * 2 // batch_size * batch_size if drop_last else len(LENGTHS) * 2
    assert rows == list(range(expected))
    assert items[0] == items[1]
