"""``pack(layout="flat")``: each batch one row of ``batch_size * seq_len`` tokens, as varlen kernels read it
(flash-linear-attention takes ``cu_seqlens`` for a batch of one row only): docs/packing.md, "The flat layout".
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


def flat_width(tokens: int, seq_len: int) -> int:
    """The epoch's last flat row: ``tokens`` rounded up to whole rows of ``seq_len``, as rows would hold them.

    Example:
        >>> flat_width(130, 64)
        192
    """
    return max(1, -(-tokens // seq_len)) * seq_len
