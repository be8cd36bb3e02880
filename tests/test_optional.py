"""Without an optional package, what needs it fails with the pip line that adds it (packages hidden here).

A package is hidden by ``sys.modules[name] = None``: ``import name`` then raises
``ModuleNotFoundError`` as if it were not installed, whatever this environment has.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import padpipe as pp
from padpipe import _command
from padpipe._optional import MissingDependencyError, require
from padpipe.recipes import pretrain as pretrain_module
from padpipe.recipes.glue import glue

HF = r"pip install 'padpipe\[hf\]' \(or: pip install {}\)$"


def hide(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Make ``import name`` (and of its submodules) fail as if the package were not installed."""
    for name in names:
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            monkeypatch.setitem(sys.modules, loaded, None)
        monkeypatch.setitem(sys.modules, name, None)


def test_require_names_the_extra_only_for_the_missing_package_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    hide(monkeypatch, "datasets")
    with pytest.raises(
        MissingDependencyError,
        match=r"^pp\.from_hf\(\) needs the datasets package, which is not "
        r"installed: " + HF.format("datasets"),
    ) as raised:
        require("datasets", "pp.from_hf()")
    assert isinstance(raised.value, ImportError) and raised.value.name == "datasets"
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_require_keeps_the_error_of_an_installed_package_that_fails_to_import(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "broken_package").mkdir()
    (tmp_path / "broken_package" / "__init__.py").write_text("import its_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match=r"^No module named 'its_missing_dependency'$"):
        require("broken_package", "x")  # a broken install, not "install broken_package"


def test_from_hf_says_to_install_datasets(monkeypatch: pytest.MonkeyPatch) -> None:
    hide(monkeypatch, "datasets")
    with pytest.raises(
        ImportError,
        match=r"^pp\.from_hf\(\) needs the datasets package, which is not installed: " + HF.format("datasets"),
    ):
        pp.from_hf([{"text": "a"}])


def test_tokenizer_folders_and_hub_names_say_to_install_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    hide(monkeypatch, "transformers")
    tail = r" needs the transformers package, which is not installed: " + HF.format("transformers")
    with pytest.raises(
        ImportError, match=rf"^loading the tokenizer folder {re.escape(repr(pp.examples.TOKENIZER_DIR))}" + tail
    ):
        pp.from_iterable([{"text": "a"}]).tokenize(pp.examples.TOKENIZER_DIR)
    with pytest.raises(ImportError, match=r"^loading the tokenizer 'bert-base-uncased' from the Hub" + tail):
        pp.from_iterable([{"text": "a"}]).tokenize("bert-base-uncased")
    with pytest.raises(ImportError, match=r"^pp\.examples\.hf_tokenizer\(\)" + tail):
        pp.examples.hf_tokenizer()
    # a tokenizer.json file needs only the core
    batch = next(iter(pp.from_iterable([{"text": "a"}]).tokenize(pp.examples.TOKENIZER_JSON).batch(1).pad().loader()))
    assert batch["input_ids"].tolist() == [[2, 81, 3]]


def test_s3_paths_say_to_install_s3fs(monkeypatch: pytest.MonkeyPatch) -> None:
    import fsspec  # noqa: F401

    registry = sys.modules["fsspec.registry"]._registry  # the backends fsspec imported already
    hide(monkeypatch, "s3fs")
    monkeypatch.delitem(registry, "s3", raising=False)  # forget an s3fs imported earlier
    with pytest.raises(
        ImportError,
        match=r"^reading 's3://bucket/train/\*\.parquet' needs the s3fs package, which is "
        r"not installed: pip install 'padpipe\[s3\]' \(or: pip install s3fs\)$",
    ):
        pp.read_parquet("s3://bucket/train/*.parquet")
    with pytest.raises(
        ImportError,
        match=r"^reading 'gs://bucket/a\.jsonl' needs the gcsfs package, which is not "
        r"installed: pip install gcsfs$",
    ):
        hide(monkeypatch, "gcsfs")
        monkeypatch.delitem(registry, "gs", raising=False)
        pp.read_jsonl("gs://bucket/a.jsonl")


def _split(folder: Path, n: int = 30) -> Path:
    rows = {
        "sentence1": [f"a {'b ' * (i % 7)}" for i in range(n)],
        "sentence2": ["c d"] * n,
        "label": [i % 2 for i in range(n)],
        "idx": list(range(n)),
    }
    path = folder / "validation-00000-of-00001.parquet"
    pq.write_table(pa.table(rows), path)
    return path


def test_glue_on_parquet_needs_no_datasets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = _split(tmp_path)
    hide(monkeypatch, "datasets")
    for data in (tmp_path, path):  # the Hub's Parquet export layout, or the file itself
        batches = list(glue("mrpc", "validation", pp.examples.tokenizer(), data=data, batch_size=8).loader())
        assert sorted(i for b in batches for i in b["row_index"].tolist()) == list(range(30))
        assert {i: r for b in batches for i, r in zip(b["row_index"].tolist(), b["idx"].tolist())} == {
            i: i for i in range(30)
        }
        lengths = [int(n) for b in batches for n in b["attention_mask"].sum(1)]
        assert lengths == sorted(lengths)  # the split sorted by length
    train = next(iter(glue("mrpc", "train", pp.examples.tokenizer(), data=path).loader()))
    assert train["input_ids"].shape[0] == 30


def test_glue_says_to_install_datasets_for_the_hub_and_save_to_disk(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "state.json").write_text("{}")
    hide(monkeypatch, "datasets")
    tail = r" needs the datasets package, which is not installed: " + HF.format("datasets")
    with pytest.raises(ImportError, match=r"^glue\(data=None\), which downloads nyu-mll/glue," + tail):
        glue("mrpc", "validation", pp.examples.tokenizer())
    with pytest.raises(ImportError, match=rf"^reading the save_to_disk folder {re.escape(repr(str(tmp_path)))}" + tail):
        glue("mrpc", "validation", pp.examples.tokenizer(), data=tmp_path)
    with pytest.raises(
        TypeError,
        match=r"^`data` must be None, a datasets\.DatasetDict or Dataset, or a local path, "
        r"but is a dict instead\.$",
    ):
        glue("mrpc", "validation", pp.examples.tokenizer(), data={"validation": []})


def test_pretrain_cli_eos_token_says_to_install_transformers(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    hide(monkeypatch, "transformers")
    argv = ["--data", pp.examples.SAMPLE_JSONL, "--tokenizer", pp.examples.TOKENIZER_JSON, "--eos-token", "[SEP]"]
    assert _command.run(pretrain_module.main, argv, prog=pretrain_module.PROG) == 2
    assert capsys.readouterr().err == (
        "python -m padpipe.recipes.pretrain: error: --eos-token needs the transformers package, which is not "
        "installed: pip install 'padpipe[hf]' (or: pip install transformers)\n"
    )


def test_the_core_install_needs_no_optional_package() -> None:
    # the import of padpipe, its readers, stages, recipes and CLIs pulls in none of the extras
    code = (
        "import sys\n"
        "for name in ('datasets', 'transformers', 's3fs', 'matplotlib'): sys.modules[name] = None\n"
        "import padpipe as pp, padpipe.demo, padpipe.recipes.glue, padpipe.recipes.pretrain\n"
        "pipe = pp.read_jsonl(pp.examples.SAMPLE_JSONL).tokenize(pp.examples.tokenizer()).pack(128, batch_size=2)\n"
        "print(next(iter(pipe.loader()))['input_ids'].shape)\n"
    )
    import subprocess

    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "torch.Size([2, 128])\n"


def test_inspect_chart_says_to_install_matplotlib(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    report = pp.inspect(pp.examples.SAMPLE_JSONL, pp.examples.tokenizer(), sample=50, progress=False)
    hide(monkeypatch, "matplotlib")
    with pytest.raises(
        ImportError,
        match=r"^inspect's chart needs the matplotlib package, which is not installed: "
        r"pip install 'padpipe\[chart\]' \(or: pip install matplotlib\)$",
    ):
        report.chart(str(tmp_path / "chart.png"))
