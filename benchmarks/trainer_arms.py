"""The arms of ``trainer.py``: each builds its data and its ``Trainer`` the way a user of that stack would.

Every arm gets the same seeded model, learning rate (constant, no warmup), tokenizer and
truncation, and trains until a meter has counted the same number of real tokens; what differs
is only how batches are made. ``build(cfg, net, tok, meter)`` returns the trainer, with all its
data preparation (``datasets.map``, TRL's packing pass, a padpipe pipeline) done inside the
timed span that ends at the first optimizer step.
"""

from __future__ import annotations

import tempfile
from typing import Any

import trainer_setup as setup
from torchdata.nodes import Mapper

import padpipe as pp

CLS_ARMS = ("hf_random", "hf_group_by_length", "hf_batch_rebalance", "padpipe_bucket", "padpipe_bucket_accum")
LM_ARMS = (*CLS_ARMS[:3], "hf_flattening", "trl_sft_bfd", *CLS_ARMS[3:], "padpipe_pack")
LABELS = {
    "hf_random": "HF Trainer, random batches + padding collator (after map)",
    "hf_group_by_length": 'HF Trainer, train_sampling_strategy="group_by_length"',
    "hf_batch_rebalance": 'HF Trainer, train_sampling_strategy="batch_rebalance" (4 accumulation steps)',
    "hf_flattening": "HF Trainer + DataCollatorWithFlattening",
    "trl_sft_bfd": 'TRL SFTTrainer, packing="bfd" (padding-free)',
    "padpipe_bucket": "padpipe.hf.Trainer, bucket(max_tokens) + pad",
    "padpipe_bucket_accum": "padpipe.hf.Trainer, bucket(max_tokens / accumulation) + pad (accumulation steps)",
    "padpipe_pack": "padpipe.hf.Trainer, pack(seq_len)",
}


def arguments(cfg: dict[str, Any], cls: Any = None, **extra: Any) -> Any:
    """The ``TrainingArguments`` every arm shares (``cls``: a subclass such as TRL's ``SFTConfig``)."""
    from transformers import TrainingArguments

    return (cls or TrainingArguments)(
        output_dir=tempfile.mkdtemp(prefix="padpipe-trainer-bench-"),
        max_steps=10**7,  # the meter stops training at the token budget
        learning_rate=cfg["lr"],
        lr_scheduler_type="constant",
        per_device_train_batch_size=cfg["batch_size"],
        save_strategy="no",
        logging_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        seed=cfg["seed"],
        dataloader_num_workers=0,
        **extra,
    )


def mapped(cfg: dict[str, Any], tok: Any) -> Any:
    """The training file as a ``datasets.Dataset``, tokenized by ``map(batched=True, num_proc=2)``."""
    import datasets

    datasets.disable_progress_bars()
    ds = datasets.Dataset.from_parquet(cfg["train"], cache_dir=tempfile.mkdtemp(prefix="padpipe-bench-ds-"))
    if cfg["task"] == "cls":
        fields = list(setup.FIELDS)
        ds = ds.map(
            lambda b: tok(*[b[f] for f in fields], truncation=True, max_length=cfg["max_length"]),
            batched=True,
            num_proc=2,
            remove_columns=fields,
        )
        return ds.rename_column("label", "labels")
    return ds.map(
        lambda b: tok(b["text"], truncation=True, max_length=cfg["max_length"], return_token_type_ids=False),
        batched=True,
        num_proc=2,
        remove_columns=["text"],
    )


def hf_trainer(cfg: dict[str, Any], net: Any, tok: Any, meter: setup.Meter) -> Any:
    """The HF arms: ``transformers.Trainer`` on the mapped dataset, with its sampler and collator."""
    import transformers as tf

    arm, extra = cfg["arm"], {}
    if arm == "hf_group_by_length":
        extra["train_sampling_strategy"] = "group_by_length"
    if arm == "hf_batch_rebalance":  # rebalances micro-batches inside each optimizer step's rows
        extra.update(train_sampling_strategy="batch_rebalance", gradient_accumulation_steps=4)
    args = arguments(cfg, **extra)
    if arm == "hf_batch_rebalance":
        args.per_device_train_batch_size = cfg["batch_size"] // 4
    if arm == "hf_flattening":
        collator: Any = tf.DataCollatorWithFlattening()
    elif cfg["task"] == "cls":
        collator = tf.DataCollatorWithPadding(tok, pad_to_multiple_of=8)
    else:
        collator = tf.DataCollatorForLanguageModeling(tok, mlm=False, pad_to_multiple_of=8)
    trainer = setup.counting(tf.Trainer, meter)
    return trainer(
        model=net,
        args=args,
        train_dataset=mapped(cfg, tok),
        data_collator=collator,
        processing_class=tok,
        callbacks=[meter.callback()],
    )


def trl_trainer(cfg: dict[str, Any], net: Any, tok: Any, meter: setup.Meter) -> Any:
    """TRL's ``SFTTrainer`` with best-fit-decreasing packing (its tokenizing and packing pass included)."""
    import datasets
    from trl import SFTConfig, SFTTrainer

    datasets.disable_progress_bars()
    ds = datasets.Dataset.from_parquet(cfg["train"], cache_dir=tempfile.mkdtemp(prefix="padpipe-bench-ds-"))
    args = arguments(
        cfg,
        SFTConfig,
        packing=True,
        packing_strategy="bfd",
        max_length=cfg["seq_len"],
        dataset_text_field="text",
        dataset_num_proc=2,
    )
    args.per_device_train_batch_size = cfg["pack_rows"]
    trainer = setup.counting(SFTTrainer, meter)
    return trainer(model=net, args=args, train_dataset=ds, processing_class=tok, callbacks=[meter.callback()])


def causal_labels(batch: dict[str, Any]) -> dict[str, Any]:
    """Labels for a padded causal-LM batch: the ids, with -100 at padding (what the LM collator does)."""
    batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    return batch


def padpipe_trainer(cfg: dict[str, Any], net: Any, tok: Any, meter: setup.Meter) -> Any:
    """``padpipe.hf.Trainer`` on a pipeline that tokenizes while it trains: token-budget buckets or packing."""
    from padpipe.hf import Trainer

    fields = setup.FIELDS if cfg["task"] == "cls" else ("text",)
    pipe = (
        pp.read_parquet(cfg["train"])
        .shuffle(buffer_size=10_000, seed=cfg["seed"])
        .tokenize(tok, fields=fields, max_length=cfg["max_length"], num_threads=cfg["tokenize_threads"])
    )
    extra: dict[str, Any] = {}
    if cfg["arm"] == "padpipe_pack":
        pipe = pipe.pack(cfg["seq_len"], batch_size=cfg["pack_rows"], long_docs="truncate")
    else:
        budget = cfg["max_tokens"]
        if cfg["arm"] == "padpipe_bucket_accum":  # batch_rebalance's step shape: the step's budget in micro-batches
            extra["gradient_accumulation_steps"] = cfg["accum_steps"]
            budget = cfg["micro_tokens"]
        pipe = pipe.bucket(max_tokens=budget, buffer_size=cfg["bucket_buffer"]).pad(pad_to_multiple_of=8)
        if cfg["task"] == "lm":
            pipe = pipe.add_stage("labels", lambda up, ctx: Mapper(up, causal_labels), output="tensors")
    trainer = setup.counting(Trainer, meter)
    return trainer(model=net, args=arguments(cfg, **extra), train_dataset=pipe, callbacks=[meter.callback()])


def build(cfg: dict[str, Any], net: Any, tok: Any, meter: setup.Meter) -> Any:
    """The trainer of arm ``cfg["arm"]``."""
    if cfg["arm"].startswith("padpipe"):
        return padpipe_trainer(cfg, net, tok, meter)
    if cfg["arm"].startswith("trl"):
        return trl_trainer(cfg, net, tok, meter)
    return hf_trainer(cfg, net, tok, meter)
