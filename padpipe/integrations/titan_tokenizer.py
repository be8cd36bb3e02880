"""torchtitan's tokenizer as padpipe tokenizes with it: the same ids as torchtitan's text loader.

torchtitan 0.3.0 encodes with ``tokenizer.encode(text, add_bos=True, add_eos=True)``; :func:`as_padpipe` gives
a ``tokenizers.Tokenizer`` making exactly those ids (docs/torchtitan.md).
"""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer, processors

from padpipe.integrations.titan_api import TOKENIZER_ATTRIBUTES

PROBES = ("", "a", "Hello, world.", "the cat sat on the mat\n\nand then ran")
"""Texts whose ids :func:`as_padpipe` compares with torchtitan's own ``encode`` before it returns."""


def as_padpipe(titan: Any) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` whose ``encode(text).ids`` equal ``titan.encode(text, add_bos=True, add_eos=True)``.

    Args:
        titan: A torchtitan ``HuggingFaceTokenizer`` (what torchtitan gives its loaders).

    Raises:
        TypeError: ``titan`` has no ``tokenizers`` model or BOS/EOS attributes.
        ValueError: The ids still differ on a probe text (a template that adds other tokens too).

    Example:
        >>> from torchtitan.components.tokenizer import HuggingFaceTokenizer  # doctest: +SKIP
        >>> titan = HuggingFaceTokenizer(tokenizer_path="assets/hf/Llama-3.1-8B")  # doctest: +SKIP
        >>> as_padpipe(titan).encode("hi").ids == titan.encode("hi", add_bos=True, add_eos=True)  # doctest: +SKIP
        True
    """
    missing = [name for name in TOKENIZER_ATTRIBUTES if not hasattr(titan, name)]
    if missing or not isinstance(titan.tokenizer, Tokenizer):
        raise TypeError(
            "padpipe.integrations.torchtitan reads torchtitan's HuggingFaceTokenizer (a tokenizers model and its "
            f"BOS/EOS attributes), but was given a {type(titan).__name__}"
            f"{' without ' + ', '.join(missing) if missing else ''}: pass a HuggingFaceTokenizer or its path, or "
            "build the pipeline yourself (PadpipeDataLoader.Config(pipeline=...))."
        )
    rust = Tokenizer.from_str(titan.tokenizer.to_str())
    adds_bos = titan.bos_id is not None and not titan.hf_adds_bos
    adds_eos = titan.eos_id is not None and not titan.hf_adds_eos
    if adds_bos or adds_eos:  # the whole sequence torchtitan makes: [BOS] ids [EOS], in one template
        ends = [(token, id_) for token, id_ in ((titan.bos_token, titan.bos_id), (titan.eos_token, titan.eos_id))]
        bos, eos = ([token] if id_ is not None else [] for token, id_ in ends)
        single = " ".join([*bos, "$A", *eos])
        pair = " ".join([*bos, "$A", *eos, *bos, "$B:1", *(f"{t}:1" for t in eos)])
        specials = [(token, id_) for token, id_ in ends if id_ is not None]
        rust.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)
    for text in PROBES:
        ours, theirs = rust.encode(text).ids, titan.encode(text, add_bos=True, add_eos=True)
        if ours != theirs:
            raise ValueError(
                f"padpipe.integrations.torchtitan: padpipe would tokenize {text!r} as {ours}, but torchtitan's "
                f"tokenizer gives {theirs}; build the pipeline yourself (PadpipeDataLoader.Config(pipeline=...))."
            )
    return rust
