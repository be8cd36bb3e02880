"""The command lines: --help with every option's meaning and default, user errors as one line and exit 2."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

import padpipe as pp
from padpipe import _command, demo
from padpipe.recipes import glue, pretrain

ROOT = Path(__file__).resolve().parent.parent
CLIS = [demo, glue, pretrain]


# -- the shared plumbing --------------------------------------------------------------------------
def test_run_prints_a_user_error_as_one_line_and_returns_2(capsys: pytest.CaptureFixture) -> None:
    for error in (
        ValueError("`seq_len` must be at least 2."),
        FileNotFoundError("No such file or folder: 'x'."),
        ImportError("x needs the datasets package"),
    ):

        def main(argv: object, error: Exception = error) -> int:
            raise error

        assert _command.run(main, [], prog="python -m padpipe.demo") == 2
        assert capsys.readouterr().err == f"python -m padpipe.demo: error: {error}\n"

    def multi_line(argv: object) -> int:
        raise ValueError("first line\n  second line")

    assert _command.run(multi_line, [], prog="x") == 2
    assert capsys.readouterr().err == "x: error: first line second line\n"
    assert _command.run(lambda argv: 0, [], prog="x") == 0


def test_run_keeps_the_traceback_of_bugs_and_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    def bug(argv: object) -> int:
        raise TypeError("'NoneType' object is not subscriptable")

    with pytest.raises(TypeError, match=r"^'NoneType' object is not subscriptable$"):
        _command.run(bug, [], prog="x")

    def mistake(argv: object) -> int:
        raise ValueError("bad value")

    monkeypatch.setenv(_command.TRACEBACK_ENV, "1")
    with pytest.raises(ValueError, match=r"^bad value$"):
        _command.run(mistake, [], prog="x")


def test_run_returns_130_quietly_on_ctrl_c(capsys: pytest.CaptureFixture) -> None:
    def interrupted(argv: object) -> int:
        raise KeyboardInterrupt

    assert _command.run(interrupted, [], prog="x") == 130
    assert capsys.readouterr().err == ""


def test_parser_shows_defaults_that_are_set() -> None:
    parser = _command.parser("python -m x", "Does x.")
    parser.add_argument("--seed", type=int, default=0, help="the seed")
    parser.add_argument("--fields", nargs="+", default=["a", "b"], help="fields")
    parser.add_argument("--data", default="/long/path", help="where (default: the sample)")
    parser.add_argument("--limit", type=int, help="a limit")
    parser.add_argument("--fast", action="store_true", help="go fast")
    text = re.sub(r"\s+", " ", parser.format_help())
    for shown in (
        "usage: python -m x",
        "--seed SEED the seed (default: 0)",
        "fields (default: a b)",
        "where (default: the sample) --limit",
        "--limit LIMIT a limit --fast",
        "--fast go fast Errors",
    ):
        assert shown in text


# -- every command line ---------------------------------------------------------------------------
@pytest.mark.parametrize("cli", CLIS, ids=lambda m: m.__name__)
def test_help_explains_every_option(cli, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: {cli.PROG} ")
    assert "``" not in text and ".py" not in text.splitlines()[0]
    parser = _parser_of(cli)
    for action in parser._actions:
        assert action.help, f"{cli.PROG} {action.option_strings} has no help"
        if action.default not in (None, argparse.SUPPRESS, False):
            assert "(default" in parser.formatter_class("x")._get_help_string(action), action.option_strings


def _parser_of(cli) -> argparse.ArgumentParser:
    """The parser ``cli.main`` builds (caught as it parses ``--help``)."""
    made = []
    real = _command.parser

    def spy(prog: str, description: str) -> argparse.ArgumentParser:
        made.append(real(prog, description))
        return made[-1]

    saved, _command.parser = _command.parser, spy
    try:
        with pytest.raises(SystemExit):
            cli.main(["--help"])
    finally:
        _command.parser = saved
    return made[0]


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["padpipe.demo", "--data", "data/trian.parquet"],
            r"python -m padpipe\.demo: error: No such file or folder: 'data/trian\.parquet'\.",
        ),
        (
            ["padpipe.recipes.glue", "--task", "mrpc", "--tokenizer", pp.examples.TOKENIZER_JSON, "--data", "mrpc"],
            r"python -m padpipe\.recipes\.glue: error: glue: no such file or folder: 'mrpc'; expected a Parquet file or "
            r"glob \(the split's rows\), a folder of Parquet files named by split \(train-\*\.parquet or "
            r"train/\*\.parquet, there or in its mrpc/ subfolder\), or a save_to_disk folder \(dataset_dict\.json or "
            r"state\.json\)\.",
        ),
        (
            ["padpipe.recipes.pretrain", "--data", pp.examples.SAMPLE_JSONL, "--tokenizer", pp.examples.TOKENIZER_JSON],
            r"python -m padpipe\.recipes\.pretrain: error: --mode pack needs an EOS token between documents, but the "
            r"tokenizer '.*tokenizer\.json' has none; name one of its tokens with --eos-token \(e\.g\. --eos-token "
            r"'\[SEP\]'\), or use --mode bucket\.",
        ),
    ],
    ids=["demo", "glue", "pretrain"],
)
def test_a_user_mistake_prints_one_line_and_exits_with_2(args: list[str], message: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1"),
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert re.fullmatch(message + "\n", done.stderr), done.stderr
    assert done.stdout == ""


def test_a_bad_option_prints_one_line_and_exits_with_2(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as done:
        glue.main(["--task", "mrcp", "--tokenizer", "x"])
    assert done.value.code == 2
    assert re.fullmatch(
        r"python -m padpipe\.recipes\.glue: error: argument --task: invalid choice: 'mrcp' "
        r"\(choose from .*\) \(see python -m padpipe\.recipes\.glue --help\)\n",
        capsys.readouterr().err,
    )


# -- the demo reads any format ----------------------------------------------------------------------
def _docs() -> pa.Table:
    return pa.table({"text": [" ".join(["word"] * (1 + i % 40)) for i in range(120)], "id": list(range(120))})


@pytest.mark.parametrize("kind", ["parquet", "arrow", "jsonl.gz", "save_to_disk"])
def test_demo_reads_any_format_a_reader_reads(kind: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    table = _docs()
    if kind == "parquet":
        data = tmp_path / "docs.parquet"
        pq.write_table(table, data)
    elif kind == "arrow":
        data = tmp_path / "docs.arrow"
        feather.write_feather(table, str(data))
    elif kind == "jsonl.gz":
        import gzip
        import json

        data = tmp_path / "docs.jsonl.gz"
        data.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in table.to_pylist()).encode()))
    else:
        datasets = pytest.importorskip("datasets")
        data = tmp_path / "saved"
        datasets.Dataset(table).save_to_disk(str(data))
    assert (
        demo.main(
            ["--data", str(data), "--fields", "text", "--max-length", "32", "--batch-size", "16", "--max-tokens", "256"]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"data: {data}"
    table = lines[lines.index(next(line for line in lines if line.startswith("strategy "))) + 2 :][:4]
    rows = {line[:34].strip(): line.split()[-5] for line in table}  # strategy -> rows
    assert rows == {
        "static (pad to 32)": "120",
        "dynamic (pad to batch max)": "120",
        "bucketed (batch_size=16)": "120",
        "token budget (max_tokens=256)": "120",
    }


def test_demo_defaults_to_the_shipped_sample() -> None:
    parser = _parser_of(demo)
    assert parser.get_default("data") == ["sample"] and parser.get_default("tokenizer") == "sample"
    assert parser.get_default("fields") is None  # found as inspect finds them


def test_glue_cli_reads_a_parquet_file_as_the_split(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "dev.parquet"
    pq.write_table(pa.table({"sentence": ["a film", "bad", "a very good film"], "label": [1, 0, 1]}), path)
    argv = ["--task", "sst2", "--split", "validation", "--tokenizer", pp.examples.TOKENIZER_JSON, "--data", str(path)]
    assert glue.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "glue sst2 validation:"
    assert lines[1].startswith("batch 0: input_ids [3, 8] int64, ") and lines[1].endswith("row_index [3] int64")
