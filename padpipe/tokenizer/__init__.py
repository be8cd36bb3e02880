"""The tokenizer wing: the batch text encoder (encoder), ``longest_first`` pair truncation (truncate) and the
texts cut short before tokenizing (prefix). ``from padpipe.tokenizer import TextEncoder`` is its public path.
"""

from padpipe.tokenizer.encoder import TextEncoder

__all__ = ["TextEncoder"]
