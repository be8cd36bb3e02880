"""The arms of ``benchmarks/sft.py``: the chat templates, the data files, TRL's ``SFTTrainer`` data path and
padpipe's ``sft`` recipe on the same rows, and the packed conversations of each, compared label by label.

Templates (written here in the shapes models and TRL's training templates have; every control token is a
special token of the shipped chat tokenizer):

- ``llama3_marked``: ``{% generation %}`` around the answer and its ``<|eot_id|>`` (TRL's Llama 3 training
  template's marking): TRL's mask is exactly padpipe's canonical span.
- ``chatml_marked``: around ``'\\n' + answer + '<|im_end|>\\n'`` (TRL's Qwen2.5 training template's): TRL
  also trains the header's newline and the newline after ``<|im_end|>``.
- ``gemma_marked``: around ``answer + '<end_of_turn>\\n'`` (TRL's Gemma training template's): TRL also
  trains the newline after ``<end_of_turn>``.
- ``chatml``: the shipped tokenizer's own template, no markers (as most models ship): TRL refuses
  ``assistant_only_loss``; padpipe finds the spans by rendering prefixes.
"""

from __future__ import annotations

import gc
import json
import statistics
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import padpipe as pp
from padpipe.recipes.sft import sft

LLAMA3_MARKED = """{%- for message in messages %}
    {%- if loop.first %}{{- bos_token }}{%- endif %}
    {%- if message.role == 'assistant' %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
        {%- generation %}{{- message.content | trim + '<|eot_id|>' }}{%- endgeneration %}
    {%- else %}
        {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"""

CHATML_MARKED = """{%- for message in messages %}
    {%- if message.role == 'assistant' %}
        {{- '<|im_start|>assistant' }}
        {%- generation %}{{- '\\n' + message.content + '<|im_end|>\\n' }}{%- endgeneration %}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""

GEMMA_MARKED = """{{- bos_token }}
{%- for message in messages %}
    {%- if message.role == 'assistant' %}
        {{- '<start_of_turn>model\\n' }}
        {%- generation %}{{- message.content | trim + '<end_of_turn>\\n' }}{%- endgeneration %}
    {%- else %}
        {{- '<start_of_turn>' + message.role + '\\n' + message.content | trim + '<end_of_turn>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"""


@dataclass(frozen=True)
class Case:
    """One row of the table: a template and a data form, run through TRL and through padpipe."""

    name: str
    template: str | None  # None: the tokenizer's own (ChatML, no markers)
    form: str = "messages"  # or "prompt_completion"


CASES = (
    Case("llama3_marked", LLAMA3_MARKED),
    Case("llama3_marked", LLAMA3_MARKED, "prompt_completion"),
    Case("chatml_marked", CHATML_MARKED),
    Case("gemma_marked", GEMMA_MARKED),
    Case("chatml", None),
)


def tokenizer(template: str | None) -> Any:
    """The shipped chat tokenizer (with a BOS token for the Llama 3 and Gemma shapes), ``template`` its own."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(pp.examples.CHAT_TOKENIZER_DIR, bos_token="<|begin_of_text|>")
    if template is not None:
        tok.chat_template = template
    return tok


def write_data(folder: Path, n: int, seed: int) -> dict[str, str]:
    """``n`` conversations from the shipped text as JSON Lines: ``messages`` rows, and the same split into a
    prompt (every message but the last answer) and its completion (the last answer)."""
    rows = pp.examples.conversations(n, seed=seed)
    paths = {"messages": str(folder / "messages.jsonl"), "prompt_completion": str(folder / "prompt_completion.jsonl")}
    with open(paths["messages"], "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    with open(paths["prompt_completion"], "w") as f:
        for row in rows:
            split = {"prompt": row["messages"][:-1], "completion": row["messages"][-1:], "id": row["id"]}
            f.write(json.dumps(split) + "\n")
    return paths


def trl_arm(case: Case, path: str, seq_len: int, batch_size: int) -> dict[str, Any]:
    """TRL's ``SFTTrainer`` constructor (its pre-pass: template, labels, BFD packing) on the rows of ``path``.

    The rows are loaded into a ``datasets.Dataset`` (its own cache folder) before the clock starts.
    Returns the pre-pass seconds and the packed rows' conversations (ids and labels, the first label -100
    as TRL's collator sets it), or ``refused`` with TRL's error.
    """
    import datasets
    import transformers
    from trl import SFTConfig, SFTTrainer

    datasets.disable_progress_bars()
    tok = tokenizer(case.template)
    data = datasets.Dataset.from_json(path, cache_dir=tempfile.mkdtemp(prefix="padpipe-sft-bench-"))
    config = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    model = transformers.LlamaForCausalLM(config)
    args = SFTConfig(
        tempfile.mkdtemp(prefix="padpipe-sft-bench-"),
        max_length=seq_len,
        packing=True,
        packing_strategy="bfd",
        assistant_only_loss=case.form == "messages",
        per_device_train_batch_size=batch_size,
        dataset_num_proc=2,
        report_to=[],
        use_cpu=True,
    )
    start = time.perf_counter()
    try:
        trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tok)
    except Exception as error:  # noqa: BLE001  TRL's refusal, raised inside datasets' map
        return {
            "refused": f"{type(error).__name__}: {str(error).split('. ')[0]}",
            "seconds": time.perf_counter() - start,
        }
    seconds = time.perf_counter() - start
    table = trainer.train_dataset.with_format("arrow")[:]
    ids = table.column("input_ids").combine_chunks().flatten().to_numpy()
    labels = table.column("labels").combine_chunks().flatten().to_numpy().copy()
    lengths = table.column("seq_lengths").combine_chunks().flatten().to_numpy()
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    labels[bounds[:-1]] = -100  # DataCollatorForLanguageModeling: no label at a sequence's first position
    conversations = [(ids[a:b], labels[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    return {
        "seconds": seconds,
        "conversations": conversations,
        "efficiency": int(lengths.sum()) / (table.num_rows * seq_len),
    }


def padpipe_options(case: Case) -> dict[str, Any]:
    """The ``sft`` recipe's arguments for a case."""
    options: dict[str, Any] = {"chat_template": case.template}
    if case.form == "prompt_completion":
        options.update(prompt="prompt", completion="completion")
    return options


def first_batch(case: Case, path: str, seq_len: int, batch_size: int, pack_buffer: int, repeat: int) -> float:
    """Median seconds from building ``sft(...)`` (template checks included) to its first packed batch."""
    tok = tokenizer(None)
    times = []
    for _ in range(repeat):
        before = set(threading.enumerate())
        start = time.perf_counter()
        pipe = sft(path, tok, seq_len=seq_len, batch_size=batch_size, pack_buffer=pack_buffer, **padpipe_options(case))
        next(iter(pipe.loader()))
        times.append(time.perf_counter() - start)
        settle(before)
    return statistics.median(times)


def settle(before: set[threading.Thread]) -> None:
    """Wait until the threads started since ``before`` (a dropped loader's) have ended: the next run starts idle."""
    gc.collect()
    for thread in set(threading.enumerate()) - before:
        thread.join(timeout=10)


def padpipe_arm(case: Case, path: str, seq_len: int, batch_size: int, pack_buffer: int) -> dict[str, Any]:
    """One epoch of the ``sft`` recipe with the conversations' ids kept: each packed conversation by its id,
    the stats, and every conversation once (asserted)."""
    pipe = sft(
        path,
        tokenizer(None),
        seq_len=seq_len,
        batch_size=batch_size,
        pack_buffer=pack_buffer,
        keep=("id",),
        **padpipe_options(case),
    )
    loader = pipe.loader()
    conversations: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for batch in loader:
        ids, labels = batch["input_ids"].numpy(), batch["labels"].numpy()
        for row, kept in enumerate(batch["id"]):
            seq = batch["seq_idx"][row].numpy()
            starts = np.flatnonzero(np.diff(seq, prepend=-1))  # each segment's first slot; padding last
            for start, stop, conversation in zip(starts, [*starts[1:], seq_len], kept):
                assert conversation not in conversations, f"conversation {conversation} packed twice"
                conversations[conversation] = (ids[row, start:stop], labels[row, start:stop])
    stats = loader.stats()
    return {"conversations": conversations, "efficiency": stats.padding_efficiency, "stats": stats}


def compare(padpipe: dict[str, Any], trl: dict[str, Any], seq_len: int, tok: Any) -> dict[str, Any]:
    """Match each packed conversation of padpipe with TRL's of the same ids; count equal labels and name the
    tokens one trains that the other does not.

    Conversations shorter than ``seq_len`` fit whole (``fit``); those of exactly ``seq_len`` tokens were cut
    (or fit exactly). TRL's conversations that padpipe has not are those padpipe dropped (no trained token
    after the cut): their TRL labels are counted if they train nothing either.
    """
    theirs: dict[bytes, list[np.ndarray]] = {}
    for ids, labels in trl["conversations"]:
        theirs.setdefault(ids.astype(np.int64).tobytes(), []).append(labels)
    found = {"fit": 0, "fit_equal": 0, "cut": 0, "cut_equal": 0, "missing": 0}
    only_trl: Counter = Counter()
    only_padpipe: Counter = Counter()
    for ids, labels in padpipe["conversations"].values():
        matches = theirs.get(ids.astype(np.int64).tobytes())
        kind = "fit" if len(ids) < seq_len else "cut"
        if not matches:
            found["missing"] += 1
            continue
        other = matches.pop()
        found[kind] += 1
        found[f"{kind}_equal"] += int(np.array_equal(labels, other))
        only_trl.update(tok.convert_ids_to_tokens(ids[(other != -100) & (labels == -100)].tolist()))
        only_padpipe.update(tok.convert_ids_to_tokens(ids[(labels != -100) & (other == -100)].tolist()))
    left = [labels for rest in theirs.values() for labels in rest]
    found["trl_only"] = len(left)
    found["trl_only_untrained"] = sum(int((labels == -100).all()) for labels in left)
    return {**found, "only_trl": only_trl, "only_padpipe": only_padpipe}
