"""The ``padpipe`` command line: ``inspect`` output and files, one-line user errors with exit status 2."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import padpipe as pp
from padpipe.cli import main

TOK = pp.examples.TOKENIZER_JSON
ROOT = Path(__file__).resolve().parents[1]
ONE_LINE = re.compile(r"^padpipe inspect: error: [^\n]+\n$")


def run_main(capsys: pytest.CaptureFixture, argv: list[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["inspect", "missing.parquet", "--tokenizer", TOK], r"No such file or folder: 'missing\.parquet'\."),
        (
            ["inspect", pp.examples.SAMPLE_PARQUET, "--tokenizer", TOK, "--fields", "sentence"],
            r"sample\.parquet: no column 'sentence'; available columns: \['sentence1', 'sentence2', 'label', 'idx'\]\.",
        ),
        (["inspect", pp.examples.SAMPLE_PARQUET], r"the following arguments are required: --tokenizer"),
        (
            ["inspect", pp.examples.SAMPLE_PARQUET, "--tokenizer", "missing.json"],
            r"Tokenizer 'missing\.json': no such file or folder\.",
        ),
        (
            ["inspect", pp.examples.SAMPLE_PARQUET, "--tokenizer", TOK, "--sample", "0"],
            r"argument --sample: expected a number of at least 1, got 0",
        ),
        (
            ["inspect", pp.examples.SAMPLE_PARQUET, "--tokenizer", TOK, "--sample", "5", "--all"],
            r"argument --all: not allowed with argument --sample",
        ),
        (
            ["inspect", pp.examples.SAMPLE_PARQUET, "--tokenizer", TOK, "--fields", "a,b,c"],
            r"argument --fields: expected one field or two separated by a comma, got 'a,b,c'",
        ),
    ],
)
def test_cli_prints_one_line_and_exits_2_on_a_user_error(capsys, argv: list[str], message: str) -> None:
    code, out, err = run_main(capsys, argv)
    assert code == 2 and out == ""
    assert ONE_LINE.match(err) and re.search(message, err), err


def test_cli_prints_one_line_when_a_file_is_unreadable(capsys, tmp_path) -> None:
    (tmp_path / "broken.parquet").write_bytes(b"not parquet at all")
    code, _, err = run_main(capsys, ["inspect", str(tmp_path / "broken.parquet"), "--tokenizer", TOK])
    assert code == 2 and ONE_LINE.match(err)
    assert "broken.parquet: not a readable Parquet file (" in err and "Traceback" not in err


def test_cli_help_names_every_option_and_its_default(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["inspect", "--help"])
    text = " ".join(capsys.readouterr().out.split()).split(" options: ", 1)[1]
    assert exit_info.value.code == 0
    for option, default in [
        ("--sample N", "(default: 20000)"),
        ("--batch-size N", "(default: 32)"),
        ("--buffer-size N", "(default: 10000)"),
        ("--pad-to-multiple-of N", "(default: 8)"),
        ("--seed N", "(default: 0)"),
        ("--max-length N", "default: the tokenizer's"),
        ("--chart PNG", "(default: no chart)"),
        ("--json FILE", "(default: no JSON)"),
    ]:
        assert option in text and default in text.split(option, 1)[1].split(" --", 1)[0], option


def test_cli_inspect_prints_the_report_and_writes_json_and_chart(capsys, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    argv = [
        "inspect",
        pp.examples.SAMPLE_PARQUET,
        "--tokenizer",
        TOK,
        "--max-length",
        "128",
        "--sample",
        "800",
        "--json",
        str(tmp_path / "r.json"),
        "--chart",
        str(tmp_path / "r.png"),
        "--no-progress",
    ]
    code, out, err = run_main(capsys, argv)
    assert code == 0 and err == ""
    assert out.startswith(f"padpipe inspect: {pp.examples.SAMPLE_PARQUET}\n")
    assert out.endswith(f"chart: {tmp_path / 'r.png'}\njson: {tmp_path / 'r.json'}\n")
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["rows_inspected"] == 800 and data["fields"] == ["sentence1", "sentence2"]
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_python_m_padpipe_runs_the_command_line(tmp_path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PADPIPE_PROGRESS": "0"}
    ok = subprocess.run(
        [sys.executable, "-m", "padpipe", "inspect", pp.examples.SAMPLE_JSONL, "--tokenizer", TOK, "--sample", "300"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert ok.returncode == 0 and ok.stderr == "" and "pack(seq_len=2048)" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "padpipe", "inspect", str(tmp_path), "--tokenizer", TOK],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert bad.returncode == 2 and bad.stdout == "" and ONE_LINE.match(bad.stderr), bad.stderr


def test_pyproject_declares_the_padpipe_console_script() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"] == {"padpipe": "padpipe.cli:main"}
    assert any(dep.startswith("tqdm") for dep in project["dependencies"])
