"""The stages that turn records into token rows: ``tokenize``, ``tokens``, ``chat`` and ``preference``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Self

from padpipe import _build
from padpipe.cache import TokenCache, chat_plan, check_recipe, tokenize_plan
from padpipe.chat.options import ChatOptions
from padpipe.chat.pairs import PREFERENCE_COLUMNS
from padpipe.errors import positive
from padpipe.pipes.preference import preference_options
from padpipe.pipes.tokenize import tokenize_options
from padpipe.pipes.tokens import tokens_options
from padpipe.readers.listing import SharedListing
from padpipe.runnable import RECORDS, TOKENS
from padpipe.stage import Stage
from padpipe.stage_chain import StageChain


def as_written(source: Stage, columns: tuple[str, ...]) -> Stage:
    """``source``, reading ``columns`` as JSON text where its reader can (JSON Lines, ``from_iterable``): a
    conversation reaches the chat template as written, not as Arrow's struct inference unifies it across rows
    (Parquet and ``datasets`` keep their own types; their ``Json`` feature is JSON text already).

    Example:
        >>> as_written(pp.read_jsonl(pp.examples.CHATS_JSONL).source, ("messages",)).options["json_columns"]
        ('messages',)
        >>> parquet = pp.read_parquet(pp.examples.SAMPLE_PARQUET).source
        >>> as_written(parquet, ("messages",)) is parquet
        True
    """
    if not getattr(source.options.get("reader"), "JSON_COLUMNS", False):
        return source
    fresh = {"listing": SharedListing()} if "listing" in source.options else {}  # its schema differs
    return Stage(source.name, source.builder, {**source.options, "json_columns": columns, **fresh})


class TokenStages(StageChain):
    """:class:`~padpipe.pipeline.Pipeline`'s methods from records to token rows (a mixin; see each method)."""

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
    ) -> Self:
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
    ) -> Self:
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
    ) -> Self:
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
    ) -> Self:
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
