"""Pretraining: raw documents to packed ``[B, seq_len]`` rows (or length-bucketed padded batches).

Example:
    >>> from transformers import AutoTokenizer
    >>> from padpipe.recipes.pretrain import pretrain
    >>> tok = AutoTokenizer.from_pretrained(pp.examples.TOKENIZER_DIR, eos_token="[SEP]")
    >>> batch = next(iter(pretrain(pp.examples.SAMPLE_JSONL, tok, seq_len=512).loader()))
    >>> batch["input_ids"].shape
    torch.Size([8, 512])

Command line: ``python -m padpipe.recipes.pretrain --help``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import padpipe as pp
from padpipe import _command, _shipped
from padpipe._optional import require
from padpipe.inspection.formats import read_corpus
from padpipe.recipes import cli
from padpipe.recipes.batching import sizes
from padpipe.tokenizer import TextEncoder

Sources = str | os.PathLike | Sequence[str | os.PathLike] | Mapping[str, Any]


def pretrain(
    sources: Sources,
    tokenizer: Any,
    *,
    seq_len: int = 2048,
    mode: Literal["pack", "bucket"] | None = None,
    batch_size: int = 8,
    max_tokens: int | None = None,
    weights: Mapping[str, float] | Sequence[float] | None = None,
    text_field: str = "text",
    shuffle_buffer: int = 10_000,
    seed: int = 0,
    model: Any = None,
) -> pp.Pipeline:
    """Language-model pretraining batches from raw text corpora, read in one streaming pass.

    Each document is tokenized without special tokens and followed by the tokenizer's EOS token
    (``doc EOS doc EOS ...``). ``mode="pack"`` packs documents into ``batch_size`` rows of exactly
    ``seq_len`` tokens, long ones split across rows (:meth:`padpipe.Pipeline.pack`); ``mode="bucket"``
    truncates each to ``seq_len``, batches similar lengths under ``max_tokens`` padded tokens and pads
    on the right (``labels``: the ids, -100 at padding). Rows are shuffled by ``seed`` through a
    ``shuffle_buffer`` buffer (and the file order per epoch). A path's format comes from its name
    (:func:`~padpipe.inspection.formats.format_of`).

    Args:
        sources: A path, glob or URL, or a list of them (one corpus, all of one format), or a dict
            ``{name: paths}`` of corpora to mix.
        tokenizer: Anything :meth:`padpipe.Pipeline.tokenize` takes; it must have an EOS token
            for ``mode="pack"``.
        seq_len: Tokens per packed row; the truncation length with ``mode="bucket"``.
        mode: ``"pack"`` or ``"bucket"``; ``None``: ``"pack"``, or ``"bucket"`` for a ``model`` that
            packing cannot keep documents apart in.
        batch_size: Packed rows per batch (``"pack"``).
        max_tokens: Padded-token budget per batch (``"bucket"``; default ``seq_len * batch_size``).
        weights: Mixing weights, by corpus name (dict ``sources``) or in the order of a list.
        text_field: The column holding each document's text.
        shuffle_buffer: Documents held in the shuffle buffer (and the bucketing buffer).
        seed: Seed of the file order, the shuffle buffer, batch order and mixing.
        model: The model to train (a transformers model or config, or its :class:`padpipe.ModelKind`):
            packs with the layout it needs, or buckets where packing cannot be right (a warning says why).

    Raises:
        ValueError: ``seq_len`` < 2, a tokenizer without EOS with ``mode="pack"``, or bad options.

    Example:
        >>> corpora = {"web": "web/*.parquet", "code": "code/"}
        >>> pipe = pretrain(corpora, tok, weights={"web": 3, "code": 1})  # doctest: +SKIP
    """
    if not isinstance(text_field, str):
        raise TypeError(f"`text_field` must be a column name, but is {text_field!r} instead.")
    mode, layout, max_tokens = sizes(
        model, mode, "pretrain", seq_len, batch_size, max_tokens, shuffle_buffer=shuffle_buffer
    )
    corpora = _corpora(sources, weights)
    eos_id, pad_id = _special_ids(tokenizer)
    if mode == "pack" and eos_id is None:
        raise ValueError(
            "pretrain(mode='pack') needs a tokenizer with an EOS token to separate documents, but this one has none; "
            "pass a tokenizer with an eos token (or set one, e.g. AutoTokenizer.from_pretrained(path, eos_token=...))."
        )

    columns = [text_field]
    if isinstance(corpora, dict):
        parts = {
            name: read_corpus(paths, columns=columns).shuffle(shuffle_buffer, seed=seed)
            for name, paths in corpora.items()
        }
        pipe = pp.mix(parts, weights=_weights_by_name(corpora, weights), seed=seed)  # type: ignore[attr-defined]
    else:
        pipe = read_corpus(corpora, columns=columns).shuffle(shuffle_buffer, seed=seed)

    if mode == "pack":
        pipe = pipe.tokenize(tokenizer, fields=text_field, truncation=False, add_special_tokens=False, append_eos=True)
        return pipe.pack(seq_len, batch_size=batch_size, layout=layout)
    # room for the EOS after truncation, whether or not append_eos counts it within max_length
    eos = {} if eos_id is None else {"append_eos": True}
    length = seq_len if eos_id is None else seq_len - 1
    pipe = pipe.tokenize(tokenizer, fields=text_field, max_length=length, add_special_tokens=False, **eos)
    pipe = pipe.bucket(max_tokens=max_tokens, buffer_size=shuffle_buffer, seed=seed)
    return pipe.pad(pad_id=pad_id if pad_id is not None else eos_id, ids_as_labels=True)


def _corpora(sources: Sources, weights: Any) -> list[str] | dict[str, list[str]]:
    """One corpus as a list of paths, or corpora to mix by name (a dict, or a list with ``weights``)."""
    if isinstance(sources, Mapping):
        if not sources:
            raise ValueError("`sources` must name at least one corpus, but is {} instead.")
        corpora = {str(name): _paths(paths) for name, paths in sources.items()}
        _weights_by_name(corpora, weights)
        return corpora
    paths = _paths(sources)
    if weights is None:
        return paths
    corpora = {path: [path] for path in paths}
    if len(corpora) != len(paths):
        raise ValueError(f"`sources` must not repeat a path when mixing by `weights`, but is {paths!r}.")
    _weights_by_name(corpora, weights)
    return corpora


def _paths(paths: Any) -> list[str]:
    items = [paths] if isinstance(paths, (str, os.PathLike)) else paths
    if not isinstance(items, (list, tuple)) or not items or not all(isinstance(p, (str, os.PathLike)) for p in items):
        raise TypeError(f"`sources` must be a path, a list of paths or a dict of them, but is {paths!r} instead.")
    return [os.fspath(p) for p in items]


def _weights_by_name(corpora: dict[str, list[str]], weights: Any) -> dict[str, float] | None:
    """Check ``weights`` against the corpora and return them by corpus name."""
    if weights is None:
        return None
    if isinstance(weights, Mapping):
        if set(weights) != set(corpora):
            raise ValueError(
                f"`weights` must have one weight per corpus {sorted(corpora)!r}, but has {sorted(weights)!r}."
            )
        by_name = {name: weights[name] for name in corpora}
    elif isinstance(weights, (list, tuple)) and len(weights) == len(corpora):
        by_name = dict(zip(corpora, weights))
    else:
        raise ValueError(f"`weights` must be a dict or a list of {len(corpora)} weights, but is {weights!r} instead.")
    for name, weight in by_name.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
            raise ValueError(f"The weight of corpus {name!r} must be a positive number, but is {weight!r} instead.")
    return by_name


def _special_ids(tokenizer: Any) -> tuple[int | None, int | None]:
    """The tokenizer's EOS and pad ids, as the tokenize stage will see them."""
    encoder = TextEncoder.load(tokenizer, max_length=None, truncation=False, add_special_tokens=False)
    return encoder.eos_id, encoder.pad_id


def load_tokenizer(path: str, eos_token: str | None) -> Any:
    """``path`` as is, or loaded with ``eos_token`` set (a ``tokenizer.json`` file or a folder).

    Setting the EOS token needs ``transformers`` (``pip install 'padpipe[hf]'``).

    Example:
        >>> load_tokenizer(pp.examples.TOKENIZER_JSON, "[SEP]").eos_token_id
        3
    """
    if eos_token is None:
        return path
    transformers = require("transformers", "--eos-token")
    if os.path.isfile(path):
        return transformers.PreTrainedTokenizerFast(tokenizer_file=path, eos_token=eos_token)
    return transformers.AutoTokenizer.from_pretrained(path, eos_token=eos_token)


PROG = "python -m padpipe.recipes.pretrain"
DESCRIPTION = """\
Pretraining batches from raw text corpora, read in one streaming pass: prints the first batches'
shapes and the packing (or padding) efficiency. Each document is followed by the tokenizer's EOS
token; --mode pack packs documents into --batch-size rows of --seq-len tokens, --mode bucket
truncates each to --seq-len and batches similar lengths under --max-tokens. A --data path's format
comes from its name (.parquet, .arrow, .jsonl[.gz|.zst], .csv).
Try it on the shipped corpus (its tokenizer has no EOS token, so [SEP] serves as one):
  python -m padpipe.recipes.pretrain --data corpus --tokenizer sample --eos-token '[SEP]'"""


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: build :func:`pretrain`'s pipeline, print batch shapes and packing efficiency.

    Example:
        >>> main(["--data", pp.examples.SAMPLE_JSONL, "--tokenizer", pp.examples.TOKENIZER_JSON, "--mode", "bucket",
        ...       "--seq-len", "512", "--max-tokens", "16384", "--max-batches", "1"])  # doctest: +ELLIPSIS
        pretrain bucket seq_len=512:
        batch 0: input_ids [...] int64, attention_mask [...] int64, token_type_ids [...] int64, labels [...] int64
        1 batches, ... rows, ... tokens in ... slots: padding efficiency ...%
        0
    """
    parser = _command.parser(PROG, DESCRIPTION)
    cli.data_arguments(parser, "one corpus", "a tokenizer.json file, a pretrained folder or a hub name", metavar="PATH")
    parser.add_argument("--eos-token", metavar="TOKEN", help="an EOS token for a tokenizer without one (padpipe[hf])")
    seq_len, mode = "tokens per packed row; truncation length in bucket mode", "pack documents, or bucket and pad them"
    cli.size_arguments(parser, seq_len=seq_len, modes=("pack", "bucket"), mode=mode)
    parser.add_argument("--text-field", default="text", metavar="NAME", help="the column holding each document's text")
    cli.run_arguments(parser)
    args = parser.parse_args(argv)
    tokenizer = load_tokenizer(_shipped.tokenizer(args.tokenizer), args.eos_token)
    eos_id = _special_ids(tokenizer)[0]
    if args.mode == "pack" and eos_id is None:
        raise ValueError(
            f"--mode pack needs an EOS token between documents, but the tokenizer {args.tokenizer!r} has none; "
            "name one of its tokens with --eos-token (e.g. --eos-token '[SEP]'), or use --mode bucket."
        )
    data = [_shipped.data(path) for path in args.data]
    pipe = pretrain(data, tokenizer, text_field=args.text_field, **cli.size_options(args))
    print(f"pretrain {args.mode} seq_len={args.seq_len}:")
    cli.run(pipe, max_batches=args.max_batches, eos_id=eos_id if args.mode == "pack" else None)
    return 0


if __name__ == "__main__":
    sys.exit(_command.run(main, prog=PROG))
