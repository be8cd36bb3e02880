"""`.chat(...).pack(...)` at its defaults on the chat templates 28 models publish (``tests/chat/published.py``:
GLM-4.6/4.7, gpt-oss, Gemma 4, Functionary, Mistral-Nemo, Granite, SmolLM3, Hermes-3, Command-R7B, Nemotron,
LFM2.5, Apertus, Qwen, DeepSeek, Llama, Mistral, Gemma 2, Phi), each tokenizer loaded from a folder as the model
ships it, on conversations with system messages, several turns, reasoning, tool calls and their results: nothing
refused; every packed row the template's own rendering of the messages up to one of its answers; every answer
trained exactly once, on the span an independent rule of the template's header and end-of-turn strings gives;
reasoning trained wherever a rendering holds it; what no rendering holds counted."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

import padpipe as pp
from tests.chat import published as pb

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore:.*the chat template does not render:UserWarning")

N = 24


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    """Each model's tokenizer folder, and the tokenizer loaded from it (for the reference)."""
    root = tmp_path_factory.mktemp("published")
    folders = {name: pb.save_tokenizer(name, root / name) for name in pb.MODELS}
    return {name: (f, transformers.AutoTokenizer.from_pretrained(f)) for name, f in folders.items()}


def render(tok: Any, row: dict[str, Any], k: int, **options: Any) -> Any:
    return tok.apply_chat_template(row["messages"][:k], tools=row["tools"], **options)


def check_row(name: str, tok: Any, row: dict[str, Any], packed: dict[str, Any]) -> dict[int, str]:
    """The answers ``packed`` trains, each with the text of its span, checked: ids are ``apply_chat_template`` of
    the messages up to an answer; trained tokens are exactly the reference spans of the answers it trains."""
    chat = row["messages"]
    ends = [k + 1 for k, m in enumerate(chat) if m["role"] == "assistant"]
    k = next((k for k in ends if packed["ids"] == render(tok, row, k, return_dict=True)["input_ids"]), None)
    assert k is not None, "a row that is no rendering of the messages up to an answer"
    text = render(tok, row, k, tokenize=False)
    raw = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    raw.post_processor = None
    offsets = np.array(raw.encode(text, add_special_tokens=False).offsets, dtype=np.int64).reshape(-1, 2)
    answers = [j for j in range(k) if chat[j]["role"] == "assistant"]
    spans = pb.reference_spans(name, text)
    assert len(spans) == len(answers), text
    trained = np.array(packed["labels"]) != -100
    found, covered = {}, np.zeros(len(trained), bool)
    for j, (lo, hi) in zip(answers, spans):
        inside = (offsets[:, 1] > lo) & (offsets[:, 0] < hi)
        if inside.any() and trained[inside].all():
            found[j] = text[lo:hi]
            covered |= inside
    assert np.array_equal(covered, trained), f"trained tokens that are no answer's reference span: {text!r}"
    assert np.array_equal(np.array(packed["labels"])[trained], np.array(packed["ids"])[trained])
    return found


@pytest.mark.parametrize("name", list(pb.MODELS))
def test_chat_packs_every_answer_once_on_its_reference_span_under_the_published_template(
    name: str, tokenizers: dict[str, tuple[Path, Any]]
) -> None:
    folder, tok = tokenizers[name]
    rows = pb.conversations(name, N, seed=1)
    loader = (
        pp.from_iterable([{"idx": i, **row} for i, row in enumerate(rows)])
        .chat(str(folder))
        .pack(8192, batch_size=2, keep=("idx",))
        .loader()
    )
    packed = pb.packed_rows(loader)
    stats = loader.stats()
    assert not stats.skipped, stats.skipped
    spans: dict[tuple[int, int], str] = {}
    times: Counter[tuple[int, int]] = Counter()
    for each in packed:
        for j, span in check_row(name, tok, rows[each["idx"]], each).items():
            spans[(each["idx"], j)] = span
            times[(each["idx"], j)] += 1
    answers = {(i, j) for i, row in enumerate(rows) for j, m in enumerate(row["messages"]) if m["role"] == "assistant"}
    assert set(times) == answers and set(times.values()) == {1}, "an answer not trained exactly once"
    dropped: Counter[str] = Counter()
    for (i, j), span in spans.items():
        message = rows[i]["messages"][j]
        if pb.thought(message) and not pb.held(span, pb.thought(message)):  # no row of the data renders it?
            for k in (j + 1, len(rows[i]["messages"])):
                text = render(tok, rows[i], k, tokenize=False)
                shown = [text[lo:hi] for lo, hi in pb.reference_spans(name, text)]
                assert not any(pb.held(s, pb.thought(message)) for s in shown), f"answer {j}'s reasoning untrained"
            dropped["reasoning"] += 1
        content = str(message.get("content") or "").split("</think>")[-1].strip()
        dropped["answer_content"] += bool(content) and not pb.held(span, content)
        dropped["tool_calls"] += sum(not pb.held(span, c["function"]["name"]) for c in message.get("tool_calls", []))
    counters = stats.counters
    assert {w: counters.get(f"chat.dropped_{w}", 0) for w in dropped} == dict(dropped)
    extra = counters.get("chat.reasoning_rows", 0) + counters.get("chat.split_rows", 0)
    assert len(packed) == len(rows) + extra
