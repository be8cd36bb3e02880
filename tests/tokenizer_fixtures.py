"""Tokenizers and texts shared by the tokenizer tests: the shipped one and two trained on the spot.

``wordpiece`` is BERT-style (pair type ids, ``token_type_ids`` in ``model_input_names``);
``bpe`` is RoBERTa-style (byte-level BPE, ``<s> A </s></s> B </s>``, no ``token_type_ids``).
Each is returned as ``(tokenizers.Tokenizer, transformers fast tokenizer)`` over the same model.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from padpipe import examples

_WORDS = "the a cat dog sat ran on under mat table quickly slowly red blue big small over".split()


def training_sentences() -> list[str]:
    """~300 short sentences made from a small vocabulary (deterministic)."""
    combos = itertools.product(_WORDS[:6], _WORDS[6:12], _WORDS[12:])
    return [" ".join(c) + "." for c in combos]


def texts() -> list[str]:
    """Texts of many shapes: empty, one word, unicode, special-token text, long, sample rows."""
    table = pq.read_table(examples.SAMPLE_PARQUET, columns=["sentence1", "sentence2"]).slice(0, 60)
    sample = table.column("sentence1").to_pylist() + table.column("sentence2").to_pylist()
    handmade = [
        "",
        "cat",
        "The cat sat on the mat.",
        "  spaces   around  ",
        "Ünïcödé naïve café — 東京 😀",
        "[CLS] looks special [SEP] but is text",
        " ".join(_WORDS * 12),
    ]
    return handmade + sample


def pairs() -> list[tuple[str, str]]:
    """Text pairs of up to 120 characters; the second text is never empty (see the empty-pair test).

    (Long pairs with a small ``max_length`` are slow in ``transformers``: the Rust tokenizer builds
    the cross product of both texts' overflowing windows. The encoder avoids that; the reference
    calls in the tests would not.)
    """
    ts = [t[:120] for t in texts()]
    firsts = ts
    seconds = [t for t in ts[1:] + ts[:1] if t] + ["x"]
    return list(zip(firsts, seconds[: len(firsts)]))


def shipped() -> tuple[Tokenizer, Any]:
    """The tokenizer shipped in ``padpipe/data`` as ``(tokenizers.Tokenizer, AutoTokenizer)``."""
    return examples.tokenizer(), examples.hf_tokenizer()


def wordpiece(**hf_options: Any) -> tuple[Tokenizer, Any]:
    """A tiny BERT-style WordPiece tokenizer trained here, and its ``transformers`` wrapper."""
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(training_sentences(), trainers.WordPieceTrainer(vocab_size=120, special_tokens=specials))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tok.decoder = decoders.WordPiece()
    options = dict(
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )
    options.update(hf_options)
    return tok, PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tok.to_str()), **options)


def bpe(**hf_options: Any) -> tuple[Tokenizer, Any]:
    """A tiny RoBERTa-style byte-level BPE tokenizer trained here (no token type ids)."""
    from transformers import PreTrainedTokenizerFast

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(training_sentences(), trainer)
    tok.post_processor = processors.RobertaProcessing(
        ("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>"))
    )
    tok.decoder = decoders.ByteLevel()
    options = dict(
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token="<mask>",
        model_input_names=["input_ids", "attention_mask"],
    )
    options.update(hf_options)
    return tok, PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tok.to_str()), **options)


def hf_rows(hf: Any, firsts: list[str], seconds: list[str] | None, **call: Any) -> tuple[list, list | None]:
    """``hf(text, text_pair, **call)`` for every row: ``(input_ids rows, token_type_ids rows or None)``."""
    ids, types = [], []
    for i, text in enumerate(firsts):
        out = hf(text, None if seconds is None else seconds[i], **call)
        ids.append(out["input_ids"])
        types.append(out.get("token_type_ids"))
    return ids, None if types and types[0] is None else types


def chunk_rows(chunk: Any) -> tuple[list, list | None]:
    """A chunk's rows as ``(ids rows, type id rows or None)``."""
    ids = [chunk.row(i).tolist() for i in range(chunk.num_rows)]
    if chunk.type_ids is None:
        return ids, None
    o = chunk.offsets
    return ids, [chunk.type_ids[o[i] : o[i + 1]].tolist() for i in range(chunk.num_rows)]


QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""Qwen2/2.5/3's pre-tokenizer split (one digit a piece)."""
QWEN_SPECIAL = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>",
]  # fmt: skip
"""Qwen3's added tokens, ids 151643-151668 in this order (those of the ``<|...|>`` form are special)."""


@functools.cache
def _qwen_json() -> str:
    """Qwen's 151,643-token BPE (``qwen.tiktoken``, as the ``dashscope`` package ships it; ``make setup`` installs
    it without its dependencies) converted by ``transformers``' ``TikTokenConverter``, with Qwen3's added tokens."""
    import base64
    import importlib.util
    import os

    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import TikTokenConverter

    spec = importlib.util.find_spec("dashscope")  # (found, not imported: only its vocabulary file is read)
    folder = list(spec.submodule_search_locations or []) if spec is not None else []
    path = os.path.join(folder[0], "resources", "qwen.tiktoken") if folder else ""
    if not os.path.isfile(path):
        pytest.skip("needs Qwen's vocabulary from the dashscope package (make setup installs it)")

    class Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:  # tiktoken's own reader, without tiktoken
            with open(tiktoken_url, "rb") as f:
                return {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in f if line)}

    tok = Converter(path, pattern=QWEN_PATTERN).converted()
    tok.add_tokens([AddedToken(t, special=t.startswith("<|"), normalized=False) for t in QWEN_SPECIAL])
    return tok.to_str()


def qwen(chat_template: str | None = None) -> Any:
    """Qwen3's real tokenizer (151,669 ids) as a fresh ``PreTrainedTokenizerFast``, EOS ``<|im_end|>``, with
    ``chat_template`` (default: none). Skipped where ``dashscope`` is not installed."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_qwen_json()), eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tok.chat_template = chat_template
    return tok
