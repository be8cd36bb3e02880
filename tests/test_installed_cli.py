"""The command lines as an installed user runs them: ``sample``/``corpus`` by name from any folder, progress, help.

The subprocess tests run from an empty temporary folder outside the clone, as after ``pip install``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import padpipe as pp
from padpipe import _shipped, cli, demo
from padpipe.recipes import glue, pretrain

ROOT = Path(__file__).resolve().parent.parent
INSTALLED = [pp.examples.SAMPLE_PARQUET, pp.examples.SAMPLE_JSONL, pp.examples.TOKENIZER_JSON]


def run_elsewhere(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m ARGS`` from an empty folder outside the clone, off a terminal."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    env.pop("PADPIPE_PROGRESS", None)
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env, check=False
    )


def help_of(main, argv: list[str], capsys: pytest.CaptureFixture) -> str:
    with pytest.raises(SystemExit):
        main(argv)
    return capsys.readouterr().out


# -- names ----------------------------------------------------------------------------------------
def test_shipped_names_are_the_installed_files_unless_a_path_of_that_name_is_here(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert (_shipped.data("sample"), _shipped.data("corpus")) == (pp.examples.SAMPLE_PARQUET, pp.examples.SAMPLE_JSONL)
    assert _shipped.tokenizer("sample") == pp.examples.TOKENIZER_JSON
    assert _shipped.data("train.parquet") == "train.parquet" and _shipped.tokenizer("corpus") == "corpus"
    (tmp_path / "sample").mkdir()
    (tmp_path / "corpus").write_text("{}\n")
    assert (_shipped.data("sample"), _shipped.data("corpus"), _shipped.tokenizer("sample")) == (
        "sample",
        "corpus",
        "sample",
    )  # what the user named, here


@pytest.mark.parametrize(
    "main, argv",
    [(cli.main, ["inspect", "--help"]), (demo.main, ["--help"]), (glue.main, ["--help"]), (pretrain.main, ["--help"])],
    ids=["inspect", "demo", "glue", "pretrain"],
)
def test_every_help_prints_the_installed_paths_whole(main, argv: list[str], capsys: pytest.CaptureFixture) -> None:
    text = help_of(main, argv, capsys)
    words = text.split()
    for path in INSTALLED:
        assert f"({path})" in words or f"({path})," in words, text  # never broken across lines
    assert "'sample' is the shipped sentence pairs" in " ".join(words)


def test_recipe_help_shows_the_names_not_clone_paths(capsys: pytest.CaptureFixture) -> None:
    for main in (glue.main, pretrain.main):
        text = help_of(main, ["--help"], capsys)
        assert "padpipe/data/" not in text.replace(os.fspath(Path(pp.examples.DATA_DIR)), "")
        assert "--tokenizer sample" in text


# -- inspect ------------------------------------------------------------------------------------------
@pytest.mark.slow  # seconds alone: make test runs it, test-fast leaves it out
def test_inspect_all_writes_sampled_false_and_shows_the_names_as_typed(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert (
        cli.main(
            [
                "inspect",
                "corpus",
                "--tokenizer",
                "sample",
                "--all",
                "--json",
                "out.json",
                "--no-progress",
                "--max-length",
                "256",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith(
        "padpipe inspect: corpus\n  jsonl, 1 file, 1 unit; 5,000 rows (exact: every row read); "
        "read every row (shuffle buffer 10,000)\n  tokenizer sample; fields text; max_length 256\n"
    )
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["sampled"] is False and report["rows_inspected"] == 5000 and report["source"] == "corpus"


@pytest.mark.slow
def test_inspect_runs_from_any_folder_and_logs_its_progress_off_a_terminal(tmp_path) -> None:
    done = run_elsewhere(
        tmp_path, "padpipe", "inspect", "sample", "--tokenizer", "sample", "--sample", "400", "--max-length", "64"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("padpipe inspect: sample\n  parquet, 1 file, 10 units; 20,000 rows")
    assert re.search(r"^inspect: reading a sample: 400 of 400 rows \(100%\), [\d.]+ s, done$", done.stderr, re.M)
    assert re.search(r"^inspect: tokenizing: 400 of 400 rows \(100%\), [\d.]+ s, done$", done.stderr, re.M)


@pytest.mark.slow
def test_padpipe_help_starts_without_importing_torch(tmp_path) -> None:
    code = (
        "import sys\nfrom padpipe import cli\ntry:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
        "cli.build_parser().format_help()\nprint('torch imported:', 'torch' in sys.modules)"
    )
    done = run_elsewhere(tmp_path, "padpipe", "--help")
    assert done.returncode == 0 and "padpipe tools." in done.stdout, done.stderr
    probe = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        check=False,
    )
    assert probe.stdout.splitlines()[-1] == "torch imported: False", probe.stdout + probe.stderr


# -- the recipes and the demo, by name, from any folder ----------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    "args, first, line",
    [
        (
            [
                "padpipe.recipes.glue",
                "--task",
                "mrpc",
                "--tokenizer",
                "sample",
                "--data",
                "sample",
                "--split",
                "validation",
                "--max-batches",
                "1",
            ],
            "glue mrpc validation:",
            r"^1 batches, 32 rows, \d+ tokens in \d+ slots: .*\Z",
        ),
        (
            [
                "padpipe.recipes.pretrain",
                "--data",
                "corpus",
                "--tokenizer",
                "sample",
                "--mode",
                "bucket",
                "--seq-len",
                "64",
                "--max-batches",
                "1",
            ],
            "pretrain bucket seq_len=64:",
            r"^1 batches, \d+ rows, \d+ tokens in \d+ slots: .*\Z",
        ),
        (
            ["padpipe.demo", "--data", "corpus", "--max-length", "64", "--batch-size", "64", "--max-tokens", "4096"],
            "data: corpus",
            r"^fields: \['text'\], max_length=64$",
        ),  # found as inspect finds them
    ],
    ids=["glue", "pretrain", "demo"],
)
def test_the_documented_commands_run_from_any_folder(tmp_path, args: list[str], first: str, line: str) -> None:
    done = run_elsewhere(tmp_path, *args)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == first and re.search(line, done.stdout.rstrip("\n"), re.M), done.stdout
