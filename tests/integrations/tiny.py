"""Tiny models and data for the framework tests (imported by the tests and by the torchrun scripts).

Data: slices of ``padpipe/data/sample.parquet`` (MRPC's columns) as an MRPC folder that
``padpipe.recipes.glue.glue(..., data=folder)`` reads. Models: a BERT of hidden size 32 and 2 layers
over the shipped tokenizer's vocabulary, built from a config.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import torch

import padpipe as pp

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).parent / "scripts"
TRAIN_ROWS, VAL_ROWS, ROW_GROUP = 1200, 301, 100  # odd: the ranks' eval shares differ by a row
VOCAB = 8000


def write_mrpc(folder: Path, train_rows: int = TRAIN_ROWS, val_rows: int = VAL_ROWS) -> Path:
    """An MRPC folder: ``train`` (row groups of 100 rows) and ``validation`` Parquet files."""
    folder.mkdir(parents=True, exist_ok=True)
    table = pq.read_table(pp.examples.SAMPLE_PARQUET).slice(0, train_rows + val_rows)
    pq.write_table(table.slice(0, train_rows), folder / "train-00000-of-00001.parquet", row_group_size=ROW_GROUP)
    pq.write_table(table.slice(train_rows, val_rows), folder / "validation-00000-of-00001.parquet")
    return folder


def bert_config() -> Any:
    from transformers import BertConfig

    return BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )


def recording_bert(seed: int = 0) -> Any:
    """A tiny ``BertForSequenceClassification`` whose ``forward`` takes ``idx`` and records each training step."""
    from transformers import BertForSequenceClassification

    class RecordingBert(BertForSequenceClassification):
        def __init__(self, config: Any) -> None:
            super().__init__(config)
            self.steps: list[dict] = []
            self.epoch = 0

        def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None, idx=None, **kwargs):
            if self.training:
                batch = digest(input_ids, attention_mask)
                self.steps.append({"epoch": self.epoch, "idx": idx.tolist(), "batch": batch})
            return super().forward(
                input_ids=input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
                labels=labels,
                **kwargs,
            )

    torch.manual_seed(seed)
    return RecordingBert(bert_config())


def finish() -> None:
    """End a torchrun script: free the DDP models first (their reducer holds the process group, and a group
    destroyed from there can deadlock with gloo's worker thread), then destroy the group."""
    import gc

    import torch.distributed as dist

    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()


def digest(*tensors: torch.Tensor) -> str:
    """A short fingerprint of tensors' shapes and bytes (batches compare equal iff tensor-equal)."""
    h = hashlib.sha1()
    for t in tensors:
        h.update(str(tuple(t.shape)).encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def run_script(script: str | Path, *args: str, processes: int = 2, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run a script (a name in ``scripts/`` or a path) on ``processes`` CPU ranks with torchrun (gloo), or
    plainly for one process; fail the test on a hang or a non-zero exit."""
    import pytest

    path = SCRIPTS / script if isinstance(script, str) else script
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"] if processes > 1 else []
    command = [sys.executable, *launcher, str(path), *args]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT, start_new_session=True
    ) as process:  # its own process group: a timeout ends the ranks too
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            pytest.fail(f"{path.name} did not finish in {timeout} s (a hang?):\n{stdout[-3000:]}\n{stderr[-6000:]}")
    assert process.returncode == 0, f"{path.name} failed:\n{stdout[-4000:]}\n{stderr[-6000:]}"
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def torchrun(script: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run ``scripts/<script>`` on 2 CPU ranks (gloo)."""
    return run_script(script, *args, timeout=timeout)


def texts(rows: int) -> list[dict]:
    """The first ``rows`` documents of the shipped corpus, as records."""
    import gzip
    import json

    with gzip.open(pp.examples.SAMPLE_JSONL, "rt") as f:
        return [{"text": json.loads(line)["text"]} for line, _ in zip(f, range(rows))]


def packed(rows: int = 17, *, seq_len: int = 64, batch_size: int = 4, **options: Any) -> pp.Pipeline:
    """Documents packed into ``[batch_size, seq_len]`` rows, reshuffled every pass."""
    return (
        pp.from_iterable(texts(rows))
        .shuffle(64, seed=0)
        .tokenize(pp.examples.tokenizer())
        .pack(seq_len, batch_size=batch_size, **options)
    )


def tiny_llama(seed: int = 0) -> Any:
    """A tiny ``LlamaForCausalLM`` over the shipped tokenizer's vocabulary (no dropout)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=256,
        )
    )
