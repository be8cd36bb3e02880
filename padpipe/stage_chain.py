"""A recipe's chain of stages: add one, check what comes before it, and what the chain knows of its tokenizer.

:class:`~padpipe.pipeline.Pipeline` mixes this in, with the stages of :mod:`padpipe.token_stages` and
:mod:`padpipe.batch_stages` and the running side of :mod:`padpipe.runnable`; the fields are the recipe's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Self

from padpipe._checks import steps_missing
from padpipe.stage import Stage
from padpipe.token_cache.plan import CachePlan
from padpipe.tokenizer.serialized import tokenizer_json


class StageChain:
    """The fields of a :class:`~padpipe.pipeline.Pipeline` and the helpers its stage methods share (a mixin).

    Example:
        >>> pipe = pp.from_iterable([{"text": "a"}]).tokenize(pp.examples.tokenizer(), max_length=16)
        >>> pipe._tokenizer_id("max_length"), pipe._tokenizer_id("pad_id")
        (16, 0)
    """

    __dataclass_fields__: ClassVar[dict[str, Any]]  # a frozen dataclass: _add makes changed copies
    source: Stage
    stages: tuple[Stage, ...]
    output: str
    cache: CachePlan | None

    def _expect(self, method: str, *kinds: str) -> None:
        if self.output not in kinds:
            raise ValueError(steps_missing(method, " or ".join(kinds), self.output))

    def _tokenizer_id(self, name: str) -> int | None:
        """``pad_id``/``eos_id``/``max_length``/``vocab_size`` of the recipe's tokenizer (or the ``pad_id`` given to
        ``tokens()``; of mixed sub-pipelines, when all agree), or ``None``."""
        encoder = next((s.options["encoder"] for s in self.stages if s.name == "tokenize"), None)
        if encoder is not None:
            return getattr(encoder, name, None)
        chat = next((s.options for s in self.stages if s.name in ("chat", "preference")), None)
        if chat is not None and name == "vocab_size":  # with the added tokens, as the chat cache checks ids
            return tokenizer_json(chat["template"].tokenizer.backend_tokenizer).id_bound
        if chat is not None:
            return chat["options"].max_length if name == "max_length" else chat["template"].token_id(name)
        if self.source.name == "mix":
            found = {pipe._tokenizer_id(name) for pipe in self.source.options["pipelines"].values()}
            return found.pop() if len(found) == 1 else None
        return next((s.options.get(name) for s in self.stages if s.name == "tokens"), None)

    def _paired(self) -> bool:
        """Whether the rows are preference pairs (``.preference()`` without ``unpaired``)."""
        return any(s.name == "preference" and not s.options["options"].unpaired for s in self.stages)

    def _pad_id(self, method: str) -> int:
        """The tokenizer's pad id (for ``pack``, else its EOS id), or the error that asks ``method`` for one."""
        pad_id = self._tokenizer_id("pad_id")
        if pad_id is None and method == "pack":
            pad_id = self._tokenizer_id("eos_id")
        if pad_id is not None:
            return pad_id
        if any(s.name == "tokens" for s in self.stages):
            raise ValueError(
                f"{method}() has no pad id: the rows entered as token ids through tokens(), with no tokenizer "
                f"to take one from; pass `pad_id=` to {method}() or to tokens()."
            )
        if method == "pack":
            raise ValueError("The tokenizer has neither a pad nor an EOS token: pass `pad_id=` to pack().")
        raise ValueError(
            "pad() found no pad token (the tokenizer has none, or tokenize() ran inside mixed sub-pipelines): "
            "pass `pad_id=`."
        )

    def _add(self, stage: Stage, output: str, **changes: Any) -> Self:
        if self.stages and self.stages[-1].name == "to_cuda":
            raise ValueError(
                f"to_cuda() must be the last stage, but .{stage.name}() follows it: add it before .to_cuda()."
            )
        return dataclasses.replace(
            self, stages=self.stages + (stage,), output=output, _epoch=[0], _managed=[False], **changes
        )
