"""The tokenizer wing: the batch text encoder (encoder), ``longest_first`` pair truncation
(truncate) and the texts cut short before tokenizing (prefix).

``from padpipe.tokenizer import TextEncoder`` is its public path.

Modules here carry plain names; the wing is private as a whole (the public face is
``padpipe/__init__.py``).
"""

from padpipe.tokenizer.encoder import TextEncoder

__all__ = ["TextEncoder"]
