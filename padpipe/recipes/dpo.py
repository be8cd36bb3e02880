"""Preference optimization (DPO and its kin: ORPO, IPO, reward models): pairs to packed rows, or to TRL's DPO layout.

Example:
    >>> from padpipe.recipes.dpo import dpo
    >>> pipe = dpo(pp.examples.PREFERENCES_JSONL, pp.examples.chat_tokenizer(), seq_len=1024, batch_size=4)
    >>> batch = next(iter(pipe.loader()))
    >>> batch["input_ids"].shape, int(batch["chosen"][0, 0])
    (torch.Size([4, 1024]), 1)

Command line: ``python -m padpipe.recipes.dpo --help``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import padpipe as pp
from padpipe import _command, _shipped
from padpipe.errors import one_of, positive
from padpipe.inspection.formats import records
from padpipe.recipes import cli
from padpipe.recipes.sft import DROPPED as CHAT_DROPPED

DROPPED = {
    "preference.too_long": "its completions do not fit max_length with a token of prompt before them",
    **{name.replace("chat.", "preference."): why for name, why in CHAT_DROPPED.items()},
}
"""Why a pair is dropped under each skip (``on_error="skip"`` for all but the first two)."""


def dpo(
    data: Any,
    tokenizer: Any,
    *,
    seq_len: int = 2048,
    mode: Literal["pack", "pad"] = "pack",
    batch_size: int = 8,
    max_length: int | None = None,
    chat_template: str | None = None,
    chat_options: Mapping[str, Any] | None = None,
    shuffle_buffer: int = 10_000,
    pack_buffer: int = 256,
    keep: Sequence[str] = (),
    seed: int = 0,
) -> pp.Pipeline:
    """Preference batches from pairs, read in one streaming pass: no pre-pass over the data.

    Each pair is rendered and labelled by :meth:`padpipe.Pipeline.preference` (TRL's formats; the completions'
    tokens in ``completion_mask``). With ``mode="pack"`` whole pairs are packed into ``batch_size`` rows of
    ``seq_len`` tokens, each member its own sequence (``chosen`` says which tokens are the chosen member's), and a
    member is cut to ``max_length = seq_len // 2`` by default, so every pair fits a row. With ``mode="pad"``
    ``batch_size`` pairs of similar length make a batch in TRL's DPO collator layout (the chosen members' rows,
    then the rejected ones'), members cut to ``max_length = seq_len`` by default. :func:`padpipe.pair_logps` sums
    each member's log-probabilities from either.

    Args:
        data: Paths, a glob, a ``datasets`` dataset or a :class:`padpipe.Pipeline` of records (as ``sft``'s).
        tokenizer: A ``transformers`` fast tokenizer with a chat template, or its pretrained folder.
        seq_len: Tokens per packed row (``"pack"``); the default ``max_length`` either way.
        mode: ``"pack"`` or ``"pad"``.
        batch_size: Packed rows per batch (``"pack"``), or pairs per batch (``"pad"``).
        max_length: The most tokens of a member (the prompt's start is cut first; see ``.preference()``).
        chat_template: A Jinja template to use instead of the tokenizer's.
        chat_options: More ``.preference()`` settings (``on_error``, ``tools``, ``template_kwargs``, ...).
        shuffle_buffer: Pairs held in the shuffle buffer (and the bucketing buffer).
        pack_buffer: Pairs held to choose fits from (``"pack"``).
        keep: Columns to carry into packed batches as lists per row (``("id",)``).
        seed: Seed of the file order, the shuffle buffer and batch order.

    Example:
        >>> pipe = dpo("pairs/*.parquet", "path/to/model", seq_len=4096, keep=("id",))  # doctest: +SKIP
    """
    positive("seq_len", seq_len)
    one_of("mode", mode, ("pack", "pad"))
    positive("batch_size", batch_size)
    positive("shuffle_buffer", shuffle_buffer)
    positive("pack_buffer", pack_buffer)
    if mode == "pad" and keep:
        raise ValueError(f"`keep` is for mode='pack'; with mode='pad' columns pass through, but is {keep!r}.")
    if max_length is None:
        max_length = seq_len // 2 if mode == "pack" else seq_len
    if mode == "pack" and 2 * max_length > seq_len:
        raise ValueError(
            f"`max_length` must be at most seq_len // 2 = {seq_len // 2} with mode='pack' (a pair holds two members "
            f"of up to max_length tokens in one row), but is {max_length} instead."
        )
    pipe = records(data).shuffle(shuffle_buffer, seed=seed)
    pipe = pipe.preference(tokenizer, max_length=max_length, chat_template=chat_template, chat_options=chat_options)
    if mode == "pack":
        return pipe.pack(seq_len, batch_size=batch_size, buffer_size=pack_buffer, keep=tuple(keep))
    return pipe.bucket(batch_size=batch_size, buffer_size=shuffle_buffer, seed=seed).pad()


def summary(stats: pp.StatsSnapshot, out: Any = None) -> None:
    """Print the pairs, their completion tokens, what was cut and what was dropped, by reason.

    Example:
        >>> snap = pp.StatsSnapshot(rows=9, batches=1, real_tokens=900, padded_tokens=1024, seconds={},
        ...                         skipped={"preference.too_long": 1},
        ...                         counters={"preference.rows": 9, "preference.tokens": 900,
        ...                                   "preference.completion_tokens": 300, "preference.prompt_cut": 2})
        >>> summary(snap)
        pairs: 9, completion tokens 300 of 900 (33.3%)
        prompt cut to max_length: 2 pairs (their first tokens, alike in both members)
        prompt rendered alone is no prefix of the pair's rendering (TRL warns): 0 pairs
        dropped: 1 pair
          preference.too_long 1: its completions do not fit max_length with a token of prompt before them
    """
    out = out or sys.stdout
    counters = stats.counters
    tokens, completion = counters.get("preference.tokens", 0), counters.get("preference.completion_tokens", 0)
    share, pairs = completion / tokens if tokens else 0.0, counters.get("preference.rows", 0)
    print(f"pairs: {pairs}, completion tokens {completion} of {tokens} ({share:.1%})", file=out)
    cut = counters.get("preference.prompt_cut", 0)
    print(f"prompt cut to max_length: {cut} pairs (their first tokens, alike in both members)", file=out)
    not_prefix = counters.get("preference.prompt_not_prefix", 0)
    print(f"prompt rendered alone is no prefix of the pair's rendering (TRL warns): {not_prefix} pairs", file=out)
    dropped = sum(stats.skipped.values())
    print(f"dropped: {dropped or 'none'}{'' if not dropped else ' pair' + ('s' if dropped != 1 else '')}", file=out)
    for name, count in sorted(stats.skipped.items()):
        print(f"  {name} {count}: {DROPPED.get(name, 'skipped under an on_error policy')}", file=out)


PROG = "python -m padpipe.recipes.dpo"
DESCRIPTION = """\
Preference (DPO) batches from pairs in TRL's formats, read in one streaming pass: prints the first batches'
shapes, the pairs, the share of completion tokens, the packing (or padding) efficiency, and what was cut or
dropped, by reason. --mode pack packs whole pairs into --batch-size rows of --seq-len tokens, each member its
own sequence; --mode pad gives TRL's DPO collator layout, --batch-size pairs a batch.
Try it on the shipped pairs and chat tokenizer (needs padpipe[hf]):
  python -m padpipe.recipes.dpo --data preferences --tokenizer chat --seq-len 1024"""


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: build :func:`dpo`'s pipeline, read an epoch, print shapes, shares and drops.

    Example:
        >>> main(["--data", pp.examples.PREFERENCES_JSONL, "--tokenizer", pp.examples.CHAT_TOKENIZER_DIR,
        ...       "--seq-len", "1024", "--max-batches", "1"])  # doctest: +ELLIPSIS
        dpo pack seq_len=1024, max_length=512:
        batch 0: input_ids [8, 1024] int64, position_ids [8, 1024] int64, seq_idx [8, 1024] int32, ...
        1 batches, ... pairs, ... tokens in 8192 slots: packing efficiency ...%
        pairs: ..., completion tokens ... of ... (...%)
        ...
        0
    """
    parser = _command.parser(PROG, DESCRIPTION)
    cli.data_arguments(parser, "pairs", "a pretrained folder with a chat template")
    seq_len, mode = "tokens per packed row", "pack pairs into rows, or pad them"
    cli.size_arguments(parser, seq_len=seq_len, modes=("pack", "pad"), mode=mode, batch="(pack), or pairs (pad)")
    parser.add_argument("--max-length", type=int, metavar="N", help="most tokens a member (default: seq-len/2 packed)")
    parser.add_argument("--chat-template", metavar="FILE", help="a Jinja chat template to use instead")
    parser.add_argument("--on-error", choices=("raise", "skip"), default="raise", help="a pair that cannot be read")
    cli.run_arguments(parser)
    args = parser.parse_args(argv)
    template = None if args.chat_template is None else Path(args.chat_template).read_text(encoding="utf-8")
    pipe = dpo(
        [_shipped.data(path) for path in args.data],
        _shipped.tokenizer(args.tokenizer),
        max_length=args.max_length,
        chat_template=template,
        chat_options={"on_error": args.on_error},
        **cli.size_options(args),
    )
    max_length = next(s for s in pipe.stages if s.name == "preference").options["options"].max_length
    print(f"dpo {args.mode} seq_len={args.seq_len}, max_length={max_length}:")
    unit = "pairs" if args.mode == "pack" else "members"
    summary(cli.run(pipe, max_batches=args.max_batches, unit=unit))
    return 0


if __name__ == "__main__":
    sys.exit(_command.run(main, prog=PROG))
