"""Files padpipe's commands write in the shared temp folder: never a fixed name, never through a planted link."""

from __future__ import annotations

import importlib.util
import os
import stat
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from padpipe import demo

ROOT = Path(__file__).resolve().parent.parent


def small_demo_args(tmp_path: Path) -> list[str]:
    data = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": [" ".join(["word"] * (1 + i % 40)) for i in range(60)]}), data)
    return ["--data", str(data), "--fields", "text", "--max-length", "32", "--batch-size", "16", "--max-tokens", "256"]


def chart_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(("chart: ", "no chart: ")))


def test_demo_writes_its_chart_to_a_new_file_and_not_through_a_planted_link(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    shared = tmp_path / "tmp"
    shared.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    os.symlink(victim, shared / "padpipe-demo-inspect.png")  # the name the demo used to write
    assert demo.main(small_demo_args(tmp_path)) == 0
    line = chart_line(capsys.readouterr().out)
    chart = Path(line.removeprefix("chart: "))
    assert chart.parent == shared and chart.name.startswith("padpipe-demo-inspect-") and chart.suffix == ".png"
    assert stat.S_ISREG(os.lstat(chart).st_mode) and chart.read_bytes().startswith(b"\x89PNG")
    assert victim.read_text() == "keep me"


def test_demo_refuses_to_write_its_chart_through_a_symlink(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    link = tmp_path / "chart.png"
    os.symlink(victim, link)
    assert demo.main([*small_demo_args(tmp_path), "--chart", str(link)]) == 0
    assert chart_line(capsys.readouterr().out) == (
        f"no chart: {link} is a symbolic link; refusing to write the chart through it."
    )
    assert victim.read_text() == "keep me"


def test_demo_writes_its_chart_to_the_path_given(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert demo.main([*small_demo_args(tmp_path), "--chart", str(tmp_path / "mine.png")]) == 0
    assert chart_line(capsys.readouterr().out) == f"chart: {tmp_path / 'mine.png'}"
    assert (tmp_path / "mine.png").read_bytes().startswith(b"\x89PNG")


def test_scale_benchmark_makes_a_new_private_workdir_unless_given_one(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("scale_benchmark", ROOT / "benchmarks" / "scale.py")
    scale = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scale)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    first, second = scale.work_folder(None), scale.work_folder(None)
    assert first != second and first.parent == second.parent == tmp_path
    assert all(
        stat.S_IMODE(os.lstat(f).st_mode) == 0o700 and f.name.startswith("padpipe-scale-") for f in (first, second)
    )
    assert scale.work_folder(str(tmp_path / "mine")) == tmp_path / "mine" and (tmp_path / "mine").is_dir()
