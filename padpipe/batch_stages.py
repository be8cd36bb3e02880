"""The stages that group token rows into batches and tensors: ``batch``, ``bucket``, ``pad`` and ``pack``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Self

import torch

from padpipe import _build
from padpipe._checks import check_budget
from padpipe.errors import check_bool, positive
from padpipe.pipes.bucket import check_bucket_options
from padpipe.pipes.cut import longest_row_allowed
from padpipe.pipes.pack import check_pack_options
from padpipe.pipes.pad import check_pad_options
from padpipe.pipes.pairs import CHOSEN
from padpipe.runnable import TENSORS, TOKEN_BATCHES, TOKENS, arguments
from padpipe.stage import Stage
from padpipe.stage_chain import StageChain


class BatchStages(StageChain):
    """:class:`~padpipe.pipeline.Pipeline`'s methods from token rows to batches (a mixin; see each method)."""

    def batch(self, batch_size: int, *, drop_last: bool = False) -> Self:
        """Group rows into batches of ``batch_size`` in arrival order (no length grouping).

        Example:
            >>> pp.from_iterable([{"text": "a"}]).tokenize(pp.examples.tokenizer()).batch(8).output
            'token batches'
        """
        self._expect("batch", TOKENS)
        positive("batch_size", batch_size)
        check_bool("drop_last", drop_last)
        stage = Stage("batch", _build.batch, {"batch_size": batch_size, "drop_last": drop_last})
        return self._add(stage, TOKEN_BATCHES)

    def bucket(
        self,
        batch_size: int | None = None,
        *,
        max_tokens: int | None = None,
        buffer_size: int = 10_000,
        drop_last: bool = False,
        shuffle: bool = True,
        seed: int | None = None,
        on_oversize: Literal["raise", "drop", "truncate"] = "raise",
        eager: bool = True,
    ) -> Self:
        """Group rows of similar length from a bounded buffer into batches.

        Exactly one of ``batch_size`` (rows per batch) or ``max_tokens`` (a budget on *padded*
        tokens: rows x longest row after ``pad_to_multiple_of``, never exceeded) is given.

        Args:
            batch_size: Rows per batch.
            max_tokens: Padded-token budget per batch.
            buffer_size: Rows sorted together; larger groups lengths better but holds more memory.
            drop_last: Drop the epoch's last batch if it is smaller than ``batch_size``.
            shuffle: Shuffle batch order (seeded) so length does not trend through the epoch.
            seed: Seed for batch order; default: the pipeline's shuffle seed, else 0.
            on_oversize: A row longer than ``max_tokens``: ``"raise"`` an error naming its length,
                ``"drop"`` it or ``"truncate"`` it to the budget (both counted in stats).
            eager: While an epoch's first buffer fills, emit a batch as soon as a bigger buffer
                could not improve it (full, every row padded to within 2% of its longest), so the
                first batch does not wait for a whole buffer; ``False``: it waits. Needs ``shuffle``.

        Example:
            >>> pipe = pp.from_iterable([{"text": "a"}]).tokenize(pp.examples.tokenizer())
            >>> pipe.bucket(max_tokens=4096).output
            'token batches'
        """
        self._expect("bucket", TOKENS)
        options = arguments(locals())
        check_bucket_options(**options)
        if max_tokens is not None and self._paired():
            raise ValueError(
                "bucket(max_tokens=) counts a row's tokens, but a preference pair pads to twice its longer member: "
                "pass bucket(batch_size=) (pairs per batch), or pack() them."
            )
        check_budget(max_tokens, on_oversize, self._tokenizer_id("max_length"))
        return self._add(Stage("bucket", _build.bucket, options), TOKEN_BATCHES)

    def pad(
        self,
        *,
        pad_id: int | None = None,
        side: Literal["right", "left"] = "right",
        pad_to_multiple_of: int | None = None,
        pad_to_length: int | None = None,
        label_pad_id: int = -100,
        dtype: torch.dtype = torch.int64,
        ids_as_labels: bool = False,
    ) -> Self:
        """Pad each batch to its longest row (rounded up to a multiple) and make tensors.

        Output: ``input_ids`` and ``attention_mask`` ``[B, L]``, ``token_type_ids`` when the
        tokenizer makes them, ``labels`` (token-level labels padded with ``label_pad_id``), and the
        other pass-through columns (numbers as tensors, strings as lists).

        Args:
            pad_id: Padding id; default: the tokenizer's pad token (error if it has none).
            side: ``"right"``, or ``"left"`` for decoder-only generation.
            pad_to_multiple_of: Round ``L`` up to a multiple (8 suits tensor cores).
            pad_to_length: Pad every batch to this fixed length instead (static padding).
            label_pad_id: Fill value for token-level labels.
            dtype: ``torch.int64`` (default) or ``torch.int32`` for ids.
            ids_as_labels: Rows without token-level labels get their ids as ``labels`` (``label_pad_id``
                at padding): the targets of causal-LM training on unpacked rows.

        Example:
            >>> pipe = pp.from_iterable([{"text": "a b"}]).tokenize(pp.examples.tokenizer()).batch(1)
            >>> next(iter(pipe.pad(pad_to_multiple_of=8).loader()))["input_ids"].shape
            torch.Size([1, 8])
        """
        self._expect("pad", TOKEN_BATCHES)
        options = {**arguments(locals()), "pad_id": self._pad_id("pad") if pad_id is None else pad_id}
        del options["ids_as_labels"]  # the plain pad's alone, added below
        budget = next((s.options["max_tokens"] for s in self.stages if s.name == "bucket"), None)
        if budget is not None:  # the bucket stage's budget must hold one padded row
            longest_row_allowed(budget, pad_to_multiple_of, pad_to_length)
        check_pad_options(**options)
        check_bool("ids_as_labels", ids_as_labels)
        if self._paired():
            if label_pad_id != -100 or ids_as_labels:
                raise ValueError(
                    "pad() of preference pairs takes `label_pad_id` -100 and no `ids_as_labels`, but they are "
                    f"{label_pad_id} and {ids_as_labels} instead."
                )
            return self._add(Stage("pad", _build.pair_pad, options), TENSORS)
        options["ids_as_labels"] = ids_as_labels
        return self._add(Stage("pad", _build.pad, options), TENSORS)

    def pack(
        self,
        seq_len: int,
        *,
        batch_size: int = 1,
        buffer_size: int = 256,
        long_docs: Literal["split", "truncate", "drop", "raise"] | None = None,
        keep_tail: bool = True,
        position_offset: int = 0,
        block_mask: bool = False,
        mask_dtype: torch.dtype | None = None,
        pad_id: int | None = None,
        label_pad_id: int = -100,
        keep: Sequence[str] = (),
        layout: Literal["rows", "flat"] = "rows",
    ) -> Self:
        """Pack documents into rows of exactly ``seq_len`` tokens (the fullest rows of a buffer, best fit decreasing).

        Output per batch, under the names HF models read (docs/packing.md): ``input_ids``,
        ``position_ids`` (restarting per document), ``labels`` (-100 at document starts and padding),
        ``seq_idx``, flash-attention ``cu_seq_lens_q/k`` and ``max_length_q/k``, with ``block_mask=True``
        a 4-D block-diagonal causal ``attention_mask``, and ``use_cache=False``. Attention models read it
        right as it is; models whose layers carry state (Mamba, Gated DeltaNet) need kernels and sometimes
        ``layout="flat"``, or no packing at all: :func:`padpipe.model_kind` says which.

        Args:
            seq_len: Tokens per packed row.
            batch_size: Packed rows per batch.
            buffer_size: Documents held to choose good fits from.
            long_docs: A document longer than ``seq_len``: ``"split"`` into ``seq_len`` pieces
                (each with its own labels), ``"truncate"`` to ``seq_len``, ``"drop"`` it (counted in
                stats) or ``"raise"`` a ``DataError`` naming it. ``None`` (default): ``"raise"`` for
                rows with token-level labels (masked SFT rows are never split unless asked),
                ``"split"`` for the others.
            keep_tail: When splitting, keep the last piece shorter than ``seq_len`` (else dropped,
                counted).
            position_offset: First position id of every document (some models count from 2).
            block_mask: Also emit the 4-D block-diagonal causal mask (``B x seq_len**2`` entries;
                for long rows prefer flash-attention, which reads ``cu_seq_lens_*``).
            mask_dtype: The mask's dtype: additive ``torch.float32`` (default; right for HF
                ``eager`` and ``sdpa`` in any model dtype), the model's own float dtype (less
                memory), or ``torch.bool`` (``sdpa`` only).
            pad_id: Padding id for unfilled slots; default: the tokenizer's pad, else its EOS.
            label_pad_id: Label at padding and document starts.
            keep: Columns (integers or strings, such as the row id ``idx``) to carry into batches,
                each as a list of ``B`` lists: the values of each row's documents, in order. Off
                by default, so that ``model(**batch)`` gets only what a model reads.
            layout: ``"rows"``, or ``"flat"``: each batch one row of ``batch_size * seq_len``
                tokens (documents of at most ``seq_len``), as flash-linear-attention's varlen
                kernels take it (docs/packing.md).

        Example:
            >>> pipe = pp.read_jsonl(pp.examples.SAMPLE_JSONL).tokenize(pp.examples.tokenizer())
            >>> next(iter(pipe.pack(512, batch_size=4).loader()))["input_ids"].shape
            torch.Size([4, 512])
        """
        self._expect("pack", TOKENS)
        options = {
            **arguments(locals()),
            "pad_id": self._pad_id("pack") if pad_id is None else pad_id,
            "keep": tuple(keep) if isinstance(keep, (list, tuple)) else keep,
            "vocab_size": self._tokenizer_id("vocab_size"),  # ids and labels checked in, and in a state
        }
        check_pack_options(**options)
        if self._paired():
            whole = long_docs not in ("split", "truncate") and label_pad_id == -100 and CHOSEN not in options["keep"]
            if not whole or layout != "rows":
                raise ValueError(
                    "pack() keeps a preference pair whole in rows: `long_docs` must be None, 'raise' or 'drop', "
                    f"`label_pad_id` -100, `keep` without {CHOSEN!r} and `layout` 'rows', but they are {long_docs!r}, "
                    f"{label_pad_id}, {keep!r}, {layout!r}; cut pairs with preference(max_length=) instead."
                )
            return self._add(Stage("pack", _build.pair_pack, options), TENSORS)
        return self._add(Stage("pack", _build.pack, options), TENSORS)
