"""Progress: a bar on a terminal, log lines elsewhere, nothing with PADPIPE_PROGRESS=0; the GLUE eval sort uses it."""

from __future__ import annotations

import io
import logging

import pyarrow as pa
import pytest
from torchdata.nodes import IterableWrapper

import padpipe as pp
from padpipe import _progress
from padpipe._progress import Progress, ProgressNode, progress_enabled


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_logs_lines_where_there_is_no_terminal(monkeypatch, caplog) -> None:
    monkeypatch.setattr(_progress, "LOG_EVERY_S", 0.0)
    caplog.set_level(logging.INFO, logger="padpipe")
    with Progress("sorting", total=4, stream=io.StringIO()) as bar:
        bar.update(1)
        bar.update(3)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("sorting: 1 of 4 rows (25%), ") and lines[-1].endswith(" s, done")
    assert lines[-2].startswith("sorting: 4 of 4 rows (100%), ") and len(lines) == 3


def test_progress_draws_a_bar_on_a_terminal(caplog) -> None:
    caplog.set_level(logging.INFO, logger="padpipe")
    terminal = Terminal()
    with Progress("tokenizing", total=10, stream=terminal) as bar:
        bar.update(10)
    assert terminal.getvalue().startswith("\rtokenizing:   0%| ") and "0/10 " in terminal.getvalue()
    assert caplog.records == []


@pytest.mark.parametrize("value", ["0", "false", "off", "no"])
def test_progress_is_off_with_the_environment_variable(monkeypatch, caplog, value: str) -> None:
    monkeypatch.setenv("PADPIPE_PROGRESS", value)
    monkeypatch.setattr(_progress, "LOG_EVERY_S", 0.0)
    caplog.set_level(logging.INFO, logger="padpipe")
    terminal = Terminal()
    with Progress("sorting", total=2, stream=terminal) as bar:
        bar.update(2)
    assert not progress_enabled() and progress_enabled(True) and terminal.getvalue() == "" and caplog.records == []


def test_progress_raises_error_when_enabled_is_not_a_bool() -> None:
    with pytest.raises(TypeError, match=r"^`progress` must be a bool, but is 'yes' instead\.$"):
        Progress("x", enabled="yes")  # type: ignore[arg-type]


def test_progress_node_passes_items_through_and_ends_its_bar(caplog) -> None:
    caplog.set_level(logging.INFO, logger="padpipe")
    batches = [pa.record_batch({"a": list(range(n))}) for n in (3, 2)]
    node = ProgressNode(IterableWrapper(batches), desc="reading", total=5, enabled=True)
    assert [b.num_rows for b in node] == [3, 2]
    assert [r.getMessage().split(", ")[0] for r in caplog.records] == ["reading: 5 of 5 rows (100%)"]
    node.reset(node.state_dict())  # a state round-trips
    assert list(node) == []


def test_glue_eval_split_shows_progress_while_it_sorts(caplog) -> None:
    datasets = pytest.importorskip("datasets")
    from padpipe.recipes.glue import glue

    dd = datasets.DatasetDict(
        validation=datasets.Dataset.from_dict(
            {"sentence": ["a fine film", "bad", "not good at all"], "label": [1, 0, 0], "idx": [0, 1, 2]}
        )
    )
    caplog.set_level(logging.INFO, logger="padpipe")
    shown = glue("sst2", "validation", pp.examples.tokenizer(), data=dd, progress=True)
    quiet = glue("sst2", "validation", pp.examples.tokenizer(), data=dd, progress=False)
    assert [s.name for s in shown.stages] == ["tokenize", "progress", "bucket", "pad"]
    assert [s.name for s in quiet.stages] == ["tokenize", "bucket", "pad"]
    batches = list(shown.loader())
    lines = [r.getMessage().split(", ")[0] for r in caplog.records]
    assert lines == ["glue sst2 validation: sorting: 3 of 3 rows (100%)"]
    assert [b["row_index"].tolist() for b in batches] == [b["row_index"].tolist() for b in quiet.loader()]
