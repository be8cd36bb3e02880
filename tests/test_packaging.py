"""What a wheel of padpipe holds and declares: license, typing marker, one copy of the shipped data."""

from __future__ import annotations

from pathlib import Path

import pytest

import padpipe as pp

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_license_is_declared_in_spdx_form_and_shipped() -> None:
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"] and "END OF TERMS AND CONDITIONS" in text
    assert "License :: " not in " ".join(PROJECT["classifiers"])  # the SPDX expression replaces license classifiers


def test_the_metadata_names_authors_and_urls() -> None:
    assert PROJECT["authors"] == [{"name": "padpipe developers"}]
    assert PROJECT["urls"]["Source"] == "https://github.com/padpipe/padpipe"
    assert "Typing :: Typed" in PROJECT["classifiers"]


def test_the_package_is_typed_and_ships_its_data_once() -> None:
    package = ROOT / "padpipe"
    assert (package / "py.typed").is_file()
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["padpipe"]
    assert "py.typed" in package_data
    assert sorted(str(p.relative_to(package)) for p in package.rglob("tokenizer.json")) == [
        "data/chat_tokenizer/tokenizer.json",
        "data/tokenizer/tokenizer.json",
    ]
    assert all(f"{folder}/*" in package_data for folder in ("data/tokenizer", "data/chat_tokenizer"))
    assert Path(pp.examples.TOKENIZER_JSON).is_file() and Path(pp.examples.TOKENIZER_DIR, "tokenizer.json").samefile(
        pp.examples.TOKENIZER_JSON
    )


def test_each_extra_installs_what_the_errors_name() -> None:
    from padpipe._optional import EXTRAS

    extras = PROJECT["optional-dependencies"]
    for package, extra in EXTRAS.items():
        if package != "huggingface_hub":  # installed by transformers and datasets
            assert any(requirement.startswith(package) for requirement in extras[extra]), (package, extra)
