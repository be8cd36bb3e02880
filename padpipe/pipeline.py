"""The fluent facade: an immutable recipe of stages, built into fresh ``torchdata.nodes`` per loader.

Each method checks its arguments at once and returns a new :class:`Pipeline` with one more stage;
nothing is read or tokenized until :meth:`Pipeline.loader` (or iteration) builds the node graph.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch.utils.data import IterableDataset
from torchdata.nodes import BaseNode

from padpipe import _build
from padpipe._checks import check_budget, shuffle_too_late, steps_missing
from padpipe.cache import TokenCache, chat_plan, check_recipe, tokenize_plan
from padpipe.chat.options import ChatOptions
from padpipe.chat.pairs import PREFERENCE_COLUMNS
from padpipe.errors import check_bool, check_seed, one_of, positive
from padpipe.pipes.bucket import check_bucket_options
from padpipe.pipes.cut import longest_row_allowed
from padpipe.pipes.device import cuda_device
from padpipe.pipes.pack import check_pack_options
from padpipe.pipes.pad import check_pad_options
from padpipe.pipes.pairs import CHOSEN
from padpipe.pipes.preference import preference_options
from padpipe.pipes.tokenize import tokenize_options
from padpipe.pipes.tokens import tokens_options
from padpipe.readers.listing import SharedListing
from padpipe.runnable import RECORDS, TENSORS, TOKEN_BATCHES, TOKENS, Runnable, arguments
from padpipe.stage import Stage
from padpipe.token_cache.plan import CachePlan
from padpipe.tokenizer.serialized import tokenizer_json


def as_written(source: Stage, columns: tuple[str, ...]) -> Stage:
    """``source``, reading ``columns`` as JSON text where its reader can (JSON Lines, ``from_iterable``): a
    conversation reaches the chat template as written, not as Arrow's struct inference unifies it across rows
    (Parquet and ``datasets`` keep their own types; their ``Json`` feature is JSON text already)."""
    if not getattr(source.options.get("reader"), "JSON_COLUMNS", False):
        return source
    fresh = {"listing": SharedListing()} if "listing" in source.options else {}  # its schema differs
    return Stage(source.name, source.builder, {**source.options, "json_columns": columns, **fresh})


@dataclass(frozen=True, eq=False)
class Pipeline(Runnable, IterableDataset):
    """A reusable recipe: a source and the stages after it.

    Build one with a reader (:func:`padpipe.read_parquet`, :func:`padpipe.read_arrow`,
    :func:`padpipe.read_jsonl`, :func:`padpipe.from_hf`, :func:`padpipe.from_iterable`), chain
    stages, then call :meth:`loader`. Every ``loader()`` call builds fresh, independent state. A
    pipeline is also a ``torch.utils.data.IterableDataset``: under
    ``DataLoader(pipe, batch_size=None, num_workers=N)`` each worker reads its own share.

    Example:
        >>> import padpipe as pp
        >>> pipe = (pp.from_iterable([{"text": "hello world"}, {"text": "hi"}])
        ...           .tokenize(pp.examples.tokenizer(), fields="text")
        ...           .batch(batch_size=2).pad())
        >>> batch = next(iter(pipe.loader()))
        >>> batch["input_ids"].shape, batch["attention_mask"].sum(1).tolist()
        (torch.Size([2, 4]), [4, 4])
    """

    source: Stage
    stages: tuple[Stage, ...] = ()
    output: str = RECORDS
    seed: int | None = None
    sharding: str = "auto"
    cache: CachePlan | None = None  # the token cache of its tokenize or chat stage: one session per built graph
    _epoch: list[int] = field(default_factory=lambda: [0], repr=False, compare=False)
    _managed: list[bool] = field(default_factory=lambda: [False], repr=False, compare=False)

    # -- stages -----------------------------------------------------------------------------------
    def shuffle(self, buffer_size: int = 10_000, *, seed: int = 0) -> Pipeline:
        """Shuffle the order of input units per epoch, then rows through a ``buffer_size`` buffer.

        Deterministic for ``(seed, epoch)``; each new pass over a loader is the next epoch.

        Args:
            buffer_size: Rows held in the shuffle buffer (memory vs randomness).
            seed: Seed for unit order, the buffer, and (by default) bucket batch order.

        Example:
            >>> pp.from_iterable([{"text": "a"}]).shuffle(buffer_size=100, seed=1).seed
            1
        """
        if self.output != RECORDS:
            raise ValueError(shuffle_too_late(self))
        positive("buffer_size", buffer_size)
        check_seed(seed)
        stage = Stage("shuffle", _build.shuffle, {"buffer_size": buffer_size, "seed": seed})
        return self._add(stage, RECORDS, seed=seed)

    def tokenize(
        self,
        tokenizer: Any,
        *,
        fields: str | tuple[str, ...] | list[str] = "text",
        max_length: int | None = None,
        truncation: bool = True,
        add_special_tokens: bool = True,
        num_threads: int = 2,
        on_error: Literal["raise", "skip"] = "raise",
        append_eos: bool = False,
        cache: str | TokenCache | None = None,
    ) -> Pipeline:
        """Tokenize one text field, or two for sentence pairs, with the fast tokenizer's batch call.

        Token ids equal ``tokenizer(text, text_pair, truncation=..., max_length=...)`` for every
        row. Other columns pass through; a ``label`` column comes out as ``labels``.

        Args:
            tokenizer: A ``transformers`` fast tokenizer, a ``tokenizers.Tokenizer``, or a path to a
                ``tokenizer.json`` file or a pretrained folder/name.
            fields: The text column, or two columns for pairs.
            max_length: Truncate to this many tokens (special tokens included). ``None`` with
                ``truncation=True`` uses the tokenizer's ``model_max_length`` when it has one.
            truncation: Whether to truncate (``longest_first`` for pairs, as ``transformers``).
            add_special_tokens: Add ``[CLS]``/``[SEP]``-style tokens from the tokenizer's template.
            num_threads: Chunks tokenized concurrently (the Rust tokenizer releases the GIL), in
                helper threads that read ahead; ``1``: in the thread that asks for a batch, no
                helpers (faster when the model trains on the same CPU cores; docs/training.md).
            on_error: ``"raise"`` on ``None``/non-string text (naming the row), or ``"skip"`` such
                rows, counted in stats as ``tokenize.bad_text``.
            append_eos: Append the tokenizer's EOS id to every row after truncation (document
                separators for packing); ``ValueError`` at once if the tokenizer has no EOS.
            cache: A folder, fsspec URL or :class:`padpipe.TokenCache`: the first pass writes the
                ids there as it goes, later passes and runs read them instead of tokenizing
                (same batches as without it; see :mod:`padpipe.cache`). Needs a reader with work
                units (``read_parquet``/``read_arrow``/``read_jsonl``/``from_hf(Dataset)``) and
                only ``shuffle`` between it and ``tokenize``.

        Example:
            >>> tok = pp.examples.tokenizer()
            >>> pipe = pp.from_iterable([{"s1": "a cat", "s2": "a dog", "label": 1}])
            >>> pipe.tokenize(tok, fields=("s1", "s2"), max_length=32).output
            'tokens'
        """
        self._expect("tokenize", RECORDS)
        options = tokenize_options(**{k: v for k, v in locals().items() if k not in ("self", "cache")})
        if cache is not None:
            check_recipe(self.source, self.stages, "tokenize")
        plan = None if cache is None else tokenize_plan(cache, options)
        return self._add(Stage("tokenize", _build.tokenize, options), TOKENS, cache=plan)

    def tokens(
        self,
        column: str = "input_ids",
        *,
        type_ids: str | None = None,
        max_length: int | None = None,
        pad_id: int | None = None,
    ) -> Pipeline:
        """Take rows that already hold token ids (a list column, as ``datasets.map(tokenizer)`` leaves it).

        The ids enter as tokens without re-tokenizing, so ``bucket``/``batch``/``pad``/``pack``
        follow as after :meth:`tokenize`. A ``token_type_ids`` column gives the type ids, an
        ``attention_mask`` column drops the padding of an earlier tokenization (tokens where it is
        0), a ``labels`` list column is kept as token-level labels; other columns pass through,
        ``label`` as ``labels``. Bad data raises ``DataError`` naming the column and row (see
        :class:`padpipe.pipes.tokens.TokenColumns`).

        Args:
            column: The list column of token ids.
            type_ids: The list column of token type ids; default: ``token_type_ids`` when present.
            max_length: Keep the first ``max_length`` tokens of longer rows.
            pad_id: The pad id ``pad()`` and ``pack()`` use when given none (there is no tokenizer
                to take one from).

        Example:
            >>> pipe = pp.from_iterable([{"input_ids": [2, 7, 3]}, {"input_ids": [2, 3]}])
            >>> next(iter(pipe.tokens(pad_id=0).batch(2).pad().loader()))["input_ids"].tolist()
            [[2, 7, 3], [2, 3, 0]]
        """
        self._expect("tokens", RECORDS)
        options = tokens_options(column=column, type_ids=type_ids, max_length=max_length, pad_id=pad_id)
        return self._add(Stage("tokens", _build.tokens, options), TOKENS)

    def chat(
        self,
        tokenizer: Any,
        *,
        messages: str = "messages",
        train_on: Literal["assistant", "last", "all"] = "assistant",
        max_length: int | None = None,
        chat_template: str | None = None,
        prompt: str | None = None,
        completion: str | None = None,
        training_field: str | None = "training",
        truncation: Literal["keep_start", "turns"] = "keep_start",
        tools: str | None = "tools",
        template_kwargs: Mapping[str, Any] | None = None,
        kwargs_column: str | None = "chat_template_kwargs",
        num_threads: int = 2,
        on_error: Literal["raise", "skip"] = "raise",
        reasoning: Literal["every_turn", "as_rendered"] = "every_turn",
        special_text: Literal["keep", "skip", "raise"] = "keep",
        cache: str | TokenCache | None = None,
    ) -> Pipeline:
        """Turn conversations into token rows with the chat template, and labels where the model is trained.

        Each row's ids are exactly ``tokenizer.apply_chat_template(messages, tools=..., **kwargs)``'s,
        and a token-level ``labels`` column holds the id where the token is trained and -100
        elsewhere, so ``.bucket(...).pad()`` (labels padded with -100) or ``.batch(n).pad()`` follow
        as after :meth:`tokenize`. Other columns pass through (``idx``/``id``, ``label`` by its name).

        A trained message's span runs from after its header (the generation prompt, for an answer) through its
        end-of-turn token, taken from ``{% generation %}`` markers or found in the rendering and checked on every
        row; a conversation that cannot be aligned is refused naming the row (a ``DataError``, or a counted skip),
        never given a wrong span. An answer whose reasoning the whole conversation drops is trained in a row of
        its own (``chat.reasoning_rows``); rows with no trained token are dropped (``chat.no_trained_tokens``).
        docs/sft.md says what is trained and counted ("What is trained", "Reasoning", "What is dropped").

        Args:
            tokenizer: A ``transformers`` fast tokenizer, or a pretrained folder (``AutoTokenizer``).
                A bare ``tokenizers.Tokenizer`` has no special-token names for the template: wrap it in
                ``PreTrainedTokenizerFast(tokenizer_object=..., eos_token=...)``.
            chat_template: A Jinja template to use instead of the tokenizer's (``ValueError`` at once
                when neither exists).
            num_threads: Chunks rendered and tokenized concurrently (as :meth:`tokenize`'s).
            cache: A folder, fsspec URL or :class:`padpipe.TokenCache`, as :meth:`tokenize`'s: the first
                pass stores what each conversation became, later passes and runs read it instead of rendering
                and tokenizing (the same batches and ``stats()``; docs/sft.md, "Chat cache"). Needs a reader
                with work units and only ``shuffle`` between it and ``chat``.

        The other keywords are the options of :class:`padpipe.chat.options.ChatOptions`, each documented and
        checked there: the columns (``messages``, or ``prompt`` and ``completion``; ``tools``, ``kwargs_column``),
        what is trained (``train_on``, ``training_field``, ``reasoning``), how a longer conversation is cut
        (``max_length``, ``truncation``), ``template_kwargs``, and what a row that cannot be rendered or labelled
        becomes (``on_error``, ``special_text``).

        Example:
            >>> template = ("{% for m in messages %}{{ m.role }}: {{ m.content }} [SEP]{% endfor %}"
            ...             "{% if add_generation_prompt %}assistant:{% endif %}")
            >>> chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
            >>> pipe = pp.from_iterable([{"messages": chat, "id": 7}]).chat(pp.examples.hf_tokenizer(),
            ...                                                                chat_template=template)
            >>> batch = next(iter(pipe.batch(1).pad().loader()))
            >>> batch["input_ids"].tolist()
            [[627, 68, 88, 23, 3, 626, 198, 546, 68, 5668, 3]]
            >>> batch["labels"].tolist(), batch["id"].tolist()  # trained: 'hello' and '[SEP]'
            ([[-100, -100, -100, -100, -100, -100, -100, -100, -100, 5668, 3]], [7])
        """
        self._expect("chat", RECORDS)
        positive("num_threads", num_threads)
        settings = ChatOptions.of(locals())  # the options among the keywords, each checked
        template = settings.template(tokenizer, chat_template)
        if cache is not None:
            check_recipe(self.source, self.stages, "chat")
        plan = None if cache is None else chat_plan(cache, template, settings)
        options = {"template": template, "options": settings, "num_threads": num_threads}
        columns = tuple(c for c in (*settings.required(), settings.tools) if c is not None)
        source = as_written(self.source, columns)
        return self._add(Stage("chat", _build.chat, options), TOKENS, source=source, cache=plan)

    def preference(
        self,
        tokenizer: Any,
        *,
        max_length: int | None = None,
        unpaired: bool = False,
        chat_template: str | None = None,
        num_threads: int = 2,
        chat_options: Mapping[str, Any] | None = None,
    ) -> Pipeline:
        """Turn preference data (DPO, ORPO, reward pairs; KTO's labelled completions) into token rows, one per pair.

        Reads TRL's formats (docs/preference.md, "Formats"), or with ``unpaired=True`` KTO's. Each member,
        ``prompt + [completion]``, is encoded by ``.chat()``'s machinery, its completion what TRL's DPO trains. A pair
        stays one token row through every later stage: ``.batch(n).pad()`` gives TRL's DPO collator layout,
        ``.pack(seq_len)`` whole pairs, each member its own sequence (:mod:`padpipe.pipes.pairs`). A member longer
        than ``max_length`` loses its prompt's first tokens (docs/preference.md, "Truncation").

        Args:
            tokenizer: A ``transformers`` fast tokenizer, or a pretrained folder (as :meth:`chat`'s).
            max_length: The most tokens of a member (TRL's ``max_length``); ``None``: no limit.
            unpaired: Read KTO's ``prompt``/``completion``/``label`` rows instead of pairs.
            chat_template: A Jinja template to use instead of the tokenizer's.
            num_threads: Chunks rendered and tokenized concurrently.
            chat_options: The :class:`~padpipe.chat.options.ChatOptions` fields that mean the same here (checked
                there): ``tools``, ``kwargs_column``, ``template_kwargs``, ``on_error`` (of a pair) and
                ``special_text``.

        Example:
            >>> row = {"prompt": [{"role": "user", "content": "2+2?"}],
            ...        "chosen": [{"role": "assistant", "content": "4"}], "rejected": [{"role": "assistant", "content": "5"}]}
            >>> batch = next(iter(pp.from_iterable([row]).preference(pp.examples.chat_tokenizer()).batch(1).pad().loader()))
            >>> batch["input_ids"].shape, batch["completion_mask"].sum(1).tolist(), batch["chosen"].tolist()
            (torch.Size([2, 17]), [3, 3], [True, False])
        """  # noqa: E501
        self._expect("preference", RECORDS)
        options = preference_options(**{k: v for k, v in locals().items() if k != "self"})
        stage = Stage("preference", _build.preference, options)
        tools = options["options"].conversation.tools
        columns = (*PREFERENCE_COLUMNS, *((tools,) if tools is not None else ()))
        return self._add(stage, TOKENS, source=as_written(self.source, columns))

    def batch(self, batch_size: int, *, drop_last: bool = False) -> Pipeline:
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
    ) -> Pipeline:
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
    ) -> Pipeline:
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
    ) -> Pipeline:
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

    def prefetch(self, prefetch: int = 2) -> Pipeline:
        """Produce up to ``prefetch`` batches ahead in a background thread.

        Example:
            >>> pipe = pp.from_iterable([{"text": "a"}]).tokenize(pp.examples.tokenizer()).batch(1).pad()
            >>> pipe.prefetch(4).output
            'tensors'
        """
        self._expect("prefetch", TENSORS)
        positive("prefetch", prefetch)
        return self._add(Stage("prefetch", _build.prefetch, {"prefetch": prefetch, "device": None}), TENSORS)

    def to(self, device: str | torch.device) -> Pipeline:
        """Move batches to ``device``: ``"cpu"`` is a no-op, ``"cuda[:N]"`` is :meth:`to_cuda`.

        Example:
            >>> pipe = pp.from_iterable([{"text": "a"}]).tokenize(pp.examples.tokenizer()).batch(1).pad()
            >>> pipe.to("cpu") is pipe
            True
        """
        self._expect("to", TENSORS)
        device = torch.device(device)
        if device.type == "cpu":
            return self
        if device.type == "cuda":
            return self.to_cuda(device, prefetch=2)
        raise ValueError(f"`device` must be 'cpu' or a CUDA device, but is {str(device)!r} instead.")

    def to_cuda(self, device: str | torch.device | int | None = None, *, prefetch: int = 2) -> Pipeline:
        """Copy batches to a GPU ahead of use: pinned memory, ``non_blocking`` copies on a side stream.

        Tensors are safe to use on the consumer's current stream. Raises ``RuntimeError`` at once
        when no CUDA device is available. It must be the last stage: it runs in the main process, next
        to the model, also with ``.loader(num_workers=N)``. Right after ``.pack(block_mask=True)`` it
        builds the 4-D mask on the GPU instead of copying ``B * seq_len**2`` entries each step.

        Args:
            device: The CUDA device; default: ``cuda:LOCAL_RANK`` when ``LOCAL_RANK`` is set (torchrun),
                else the current device (both read when the loader starts, in the process that copies).
            prefetch: Batches copied ahead.

        Example:
            >>> pipe.to_cuda(prefetch=2)  # doctest: +SKIP
        """
        self._expect("to_cuda", TENSORS)
        positive("prefetch", prefetch)
        device = cuda_device(device)
        pipe, mask_dtype, last = self, None, self.stages[-1] if self.stages else None
        if last is not None and last.name == "pack" and last.options["block_mask"]:  # build the mask on the GPU
            mask_dtype = last.options["mask_dtype"] or torch.float32
            plain = dataclasses.replace(last, options={**last.options, "block_mask": False, "mask_dtype": None})
            pipe = dataclasses.replace(self, stages=self.stages[:-1] + (plain,))
        options = {"prefetch": prefetch, "device": device, "block_mask": mask_dtype}
        return pipe._add(Stage("to_cuda", _build.prefetch, options), TENSORS)

    def add_stage(self, name: str, builder: Callable[..., BaseNode], *, output: str, **options: Any) -> Pipeline:
        """Append a custom stage: ``builder(upstream_node, context, **options)`` returns its node.

        ``output`` names what it yields: ``"records"``, ``"tokens"``, ``"token batches"`` or ``"tensors"``.

        Example:
            >>> from torchdata.nodes import Batcher
            >>> pipe = pp.from_iterable([{"text": "a"}]).add_stage("pairs", lambda up, ctx: Batcher(up, 2, False),
            ...                                                     output="records")
            >>> pipe.stages[-1].name
            'pairs'
        """
        one_of("output", output, (RECORDS, TOKENS, TOKEN_BATCHES, TENSORS))
        return self._add(Stage(name, builder, options), output)

    # -- internals --------------------------------------------------------------------------------
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

    def _add(self, stage: Stage, output: str, **changes: Any) -> Pipeline:
        if self.stages and self.stages[-1].name == "to_cuda":
            raise ValueError(
                f"to_cuda() must be the last stage, but .{stage.name}() follows it: add it before .to_cuda()."
            )
        return dataclasses.replace(
            self, stages=self.stages + (stage,), output=output, _epoch=[0], _managed=[False], **changes
        )
