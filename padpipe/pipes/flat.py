"""``pack(layout="flat")``: each batch as one row of ``batch_size * seq_len`` tokens, for varlen kernels.

A model whose layers carry state from token to token (Gated DeltaNet, KDA, short convolutions,
Mamba-2) keeps packed documents apart only in kernels given the documents' boundaries, and
flash-linear-attention takes them (``cu_seqlens``) for a batch of one row only ("The batch size is
expected to be 1 rather than B when using `cu_seqlens`"). So the flat layout packs each batch as
that one row: the packer fills bins of ``batch_size * seq_len`` tokens (one a batch) with pieces of
at most ``seq_len`` tokens, so only the batch's end is padding, and the batch's keys describe that
row as the kernels' varlen contracts read them:

- ``input_ids``, ``position_ids``, ``labels`` ``[1, batch_size * seq_len]`` int64;
- ``seq_idx`` ``[1, batch_size * seq_len]`` int32, contiguous (causal-conv1d's and mamba-ssm's
  ``seq_idx``: ``[batch, seqlen]`` int32);
- ``cu_seq_lens_q``/``_k`` ``[S + 1]`` int32 from 0 to ``batch_size * seq_len`` (flash-linear-attention's
  ``cu_seqlens``: ``[N + 1]``, batch size 1; its own helpers make them int32), ``max_length_q``/``_k``.

The token budget is that of ``[batch_size, seq_len]`` rows; every promise of ``pack()`` holds as
for any packed batch of one row (the epoch's last steps cut it between documents).
"""

from __future__ import annotations

from padpipe.errors import one_of

LAYOUTS = ("rows", "flat")


def check_layout(layout: str, *, block_mask: bool) -> None:
    """Raise ``ValueError`` for a layout ``pack()`` cannot make.

    Example:
        >>> check_layout("flat", block_mask=True)
        Traceback (most recent call last):
        ...
        ValueError: `block_mask` must be False with layout='flat' (a mask over the whole batch), but is True instead.
    """
    one_of("layout", layout, LAYOUTS)
    if layout == "flat" and block_mask:
        raise ValueError(
            "`block_mask` must be False with layout='flat' (a mask over the whole batch), but is True instead."
        )


def bins(seq_len: int, batch_size: int, layout: str) -> tuple[int, int]:
    """The ``(row length, rows per batch)`` the packer fills: the rows themselves, or one row of them all.

    Example:
        >>> bins(512, 8, "rows"), bins(512, 8, "flat")
        ((512, 8), (4096, 1))
    """
    return (seq_len * batch_size, 1) if layout == "flat" else (seq_len, batch_size)
