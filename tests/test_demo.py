"""``python -m padpipe.demo``: a row as each strategy finishes, an untimed warm-up first, fields found as inspect does."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from padpipe import demo
from padpipe.errors import DataError

SMALL = ["--max-length", "32", "--batch-size", "16", "--max-tokens", "256"]


def write(path: Path, **columns: list) -> str:
    pq.write_table(pa.table(columns), path)
    return str(path)


@pytest.fixture
def docs(tmp_path: Path) -> str:
    return write(
        tmp_path / "docs.parquet", body=[" ".join(["word"] * (1 + i % 30)) for i in range(90)], id=list(range(90))
    )


def test_demo_prints_each_row_as_its_strategy_finishes_after_an_untimed_warm_up(docs, monkeypatch, capsys) -> None:
    events: list[str] = []
    real_measure, real_warm_up = demo.measure, demo.warm_up

    def measure(name, pipe):
        shown = [line for line in capsys.readouterr().out.splitlines() if line.endswith("ms")]
        events.append(f"measure {name} after {len(shown)} rows")
        return real_measure(name, pipe)

    def warm_up(base, *, batch_size):
        events.append("warm up")
        return real_warm_up(base, batch_size=batch_size)

    monkeypatch.setattr(demo, "measure", measure)
    monkeypatch.setattr(demo, "warm_up", warm_up)
    assert demo.main(["--data", docs, *SMALL]) == 0
    assert events == [
        "warm up",
        "measure static (pad to 32) after 0 rows",
        "measure dynamic (pad to batch max) after 1 rows",
        "measure bucketed (batch_size=16) after 1 rows",
        "measure token budget (max_tokens=256) after 1 rows",
    ]  # each row printed before the next runs


def test_demo_finds_the_one_string_column_as_inspect_does(docs, capsys) -> None:
    assert demo.main(["--data", docs, *SMALL]) == 0
    out = capsys.readouterr().out
    assert "fields: ['body'], max_length=32\n" in out
    assert re.search(r"^static \(pad to 32\) +\d+ +90 ", out, re.M)


def test_demo_says_to_pass_fields_when_it_cannot_tell_them(tmp_path) -> None:
    path = write(tmp_path / "three.parquet", a=["x"], b=["y"], c=["z"])
    with pytest.raises(
        DataError,
        match=rf"^{re.escape(path)}: no 'text' column and 3 string columns, not one or two; "
        r"pass the text field\(s\) with --fields A \[B\], from the columns "
        r"\['a', 'b', 'c'\]\.$",
    ):
        demo.main(["--data", path, *SMALL])
