"""``padpipe check-packing MODEL --data DATA``: a local model folder or config, exit 0 when exact, 1 with the cause."""

from __future__ import annotations

import os
import re

import pytest

from padpipe.cli import main
from padpipe.inspection.packing_command import load_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


def llama_config(**changes) -> transformers.LlamaConfig:
    options = dict(vocab_size=8000, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    return transformers.LlamaConfig(**{**options, **changes})


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(["check-packing", *argv, "--data", "corpus", "--tokenizer", "sample", "--seq-len", "64"])
    out, err = capsys.readouterr()
    return code, out, err


def test_check_packing_command_passes_a_model_that_packs_exactly(tmp_path, capsys) -> None:
    torch.manual_seed(0)
    saved = transformers.LlamaForCausalLM(llama_config(use_cache=False))
    saved.save_pretrained(tmp_path)  # weights and config
    loaded = load_model(str(tmp_path), attn_implementation="eager", dtype=None, device="cpu")
    assert loaded.config._attn_implementation == "eager"
    assert all(torch.equal(a, b) for a, b in zip(saved.state_dict().values(), loaded.state_dict().values()))
    code, out, err = run(capsys, str(tmp_path), "--attn-implementation", "eager")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("check_packing: attn_implementation='eager', use_cache=False, dtype=torch.float32")
    assert re.fullmatch(r"exact: 8 documents get their own logits and loss \(max abs difference \S+\)", lines[-1])
    assert len(lines) == 10


def test_check_packing_command_exits_1_naming_the_cause(tmp_path, capsys) -> None:
    config = tmp_path / "config.json"
    llama_config(attn_implementation="sdpa").to_json_file(config)  # a config only: random weights
    code, out, err = run(capsys, str(config))  # use_cache=True in the config: the batch's use_cache=False wins
    assert code == 0
    mamba = tmp_path / "mamba.json"
    transformers.MambaConfig(vocab_size=8000, hidden_size=32, num_hidden_layers=2).to_json_file(mamba)
    code, out, err = run(capsys, str(mamba))
    assert code == 1 and out.splitlines()[-1].startswith("wrong: ")
    assert re.match(
        r"^padpipe check-packing: check_packing: \d+ of 8 documents get other logits packed than alone, .*; "
        r"cause \[recurrent_state\]: MambaForCausalLM: state runs on from one document into the next in its 2 "
        r"linear_attention layers \(MambaMixer\), and nothing keeps packed documents apart in them .*Fix: do not "
        r"pack: \.bucket\(max_tokens=\.\.\.\)\.pad\(\): one document a row, padding on the right\.$",
        err,
    )
    code, out, err = run(capsys, str(config), "--block-mask")
    assert code == 0


def test_check_packing_command_prints_one_line_on_a_missing_model(tmp_path, capsys) -> None:
    code, out, err = run(capsys, str(tmp_path / "missing"))
    assert code == 2 and out == ""
    assert err == (
        f"padpipe check-packing: error: check-packing: MODEL '{tmp_path / 'missing'}': no such file or folder; "
        "expected a model folder or a config.json.\n"
    )


def test_check_packing_command_prints_one_line_on_a_folder_or_file_that_is_no_model(tmp_path, capsys) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.md").write_text("not a model")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    (tmp_path / "unknown.json").write_text('{"model_type": "no_such_model"}')
    found = {
        "notes": "Unrecognized model in {path}",
        "broken": "It looks like the config file at '{path}/config.json' is not a valid JSON file",
        "unknown.json": "The checkpoint you are trying to load has model type `no_such_model` but Transformers does not "
        "recognize this architecture",
    }
    for name, what in found.items():
        path = tmp_path / name
        code, out, err = run(capsys, str(path))
        assert code == 2 and out == ""
        assert err == (
            f"padpipe check-packing: error: check-packing: MODEL '{path}' is not a model: {what.format(path=path)}; "
            "expected a model folder with a config.json, or a config.json.\n"
        )


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without CUDA")
def test_check_packing_command_prints_one_line_on_a_device_torch_cannot_use(tmp_path, capsys) -> None:
    config = tmp_path / "config.json"
    llama_config().to_json_file(config)
    code, out, err = run(capsys, str(config), "--device", "cuda")  # "not compiled with CUDA", or no driver
    assert code == 2 and out == ""
    assert re.fullmatch(
        r"padpipe check-packing: error: check-packing: --device 'cuda': [^\n]+; expected a device this torch can use "
        r"\(cpu, cuda, mps \.\.\.\)\.\n",
        err,
    )
    code, out, err = run(capsys, str(config), "--device", "gpu")
    assert code == 2 and re.match(
        r"^padpipe check-packing: error: check-packing: --device 'gpu': Expected one of ", err
    )
