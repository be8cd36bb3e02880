"""The packing and first-step sections of ``benchmarks/sft.py``: efficiency beside TRL's and the bound, the
cost of the fill per conversation, and seconds from a script's start to its first optimizer step.

- :func:`packing_rows`: on the conversations padpipe packed (their lengths as the ``sft`` recipe made them) and
  on long documents (lognormal lengths, median 300, tail to 10,000; random ids; the first 1,000 of them also in
  rows of 512, 8 a batch), the packing efficiency of
  padpipe's ``pack()`` at its default pool (256 pieces), of TRL's ``pack_dataset`` (``bfd`` on chats,
  ``bfd_split`` on documents: as ``SFTTrainer`` calls it, one ``datasets`` map batch of 1,000 rows at a time,
  and over the whole epoch at once), and the bound: total tokens over ``ceil(total / seq_len)`` rows (padpipe's
  efficiency counts the documents' own tokens: the cut token a split piece repeats as context is not counted);
  padpipe's packer alone on prepared chunks (microseconds per conversation, of which planning rows), and its
  state mid-epoch.
- :func:`first_step_rows`: a fresh Python process per arm, timed from its start to the end of its first
  optimizer step (imports, tokenizer, a tiny Llama, TRL's pre-pass or padpipe's first batch, one step).
"""

from __future__ import annotations

import math
import os
import pickle
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from torchdata.nodes import IterableWrapper

from padpipe.chunks import TokenChunk
from padpipe.pipes.pack import Packer
from padpipe.stats import PipelineStats

HERE = Path(__file__).resolve().parent


def bound(lengths: np.ndarray, seq_len: int) -> float:
    """Total tokens over the fewest rows of ``seq_len`` that could hold them."""
    total = int(lengths.sum())
    return total / (math.ceil(total / seq_len) * seq_len)


def trl_efficiency(docs: list[np.ndarray], seq_len: int, strategy: str, whole: bool = False) -> float:
    """TRL's ``pack_dataset`` on these token lists: real tokens over packed rows x ``seq_len``."""
    import datasets
    from trl.data_utils import pack_dataset

    datasets.disable_progress_bars()
    data = datasets.Dataset.from_dict({"input_ids": [d.tolist() for d in docs]})
    packed = pack_dataset(data, seq_len, strategy, map_kwargs={"batch_size": len(docs)} if whole else None)
    lengths = packed.with_format("arrow")[:].column("seq_lengths").combine_chunks().flatten().to_numpy()
    return int(lengths.sum()) / (packed.num_rows * seq_len)


def chunks_of(docs: list[np.ndarray], rows: int = 1024) -> list[TokenChunk]:
    return [TokenChunk.from_lists([d.tolist() for d in docs[i : i + rows]]) for i in range(0, len(docs), rows)]


def packer_run(docs: list[np.ndarray], seq_len: int, batch_size: int, long_docs: str | None) -> dict[str, Any]:
    """padpipe's packer alone over prepared chunks: efficiency, seconds (and in planning rows), state size."""
    stats = PipelineStats()
    node = Packer(IterableWrapper(chunks_of(docs)), seq_len=seq_len, batch_size=batch_size, pad_id=0,
                  long_docs=long_docs, stats=stats)  # fmt: skip
    spent = [0.0]
    plan = node._plan

    def timed() -> None:
        start = time.perf_counter()
        plan()
        spent[0] += time.perf_counter() - start

    node._plan = timed  # type: ignore[method-assign]
    start = time.perf_counter()
    state = b""
    for number, _ in enumerate(node):
        if number == 20:
            state = pickle.dumps(node.state_dict())
    seconds = time.perf_counter() - start
    snap = stats.snapshot()
    own = snap.real_tokens - snap.counters.get("pack.context_tokens", 0)  # a cut token repeated as context: not counted
    return {"efficiency": own / snap.padded_tokens, "seconds": seconds, "fill": spent[0], "state": len(state)}


def long_documents(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.round(rng.lognormal(np.log(300), 1.0, n)), 2, 10_000).astype(np.int64)
    return [rng.integers(5, 30_000, size=int(k), dtype=np.int64) for k in lengths]


def packing_rows(conversations: list[np.ndarray], seq_len: int, batch_size: int, has_trl: bool,
                 padpipe_eff: float, documents: int) -> list[list[str]]:  # fmt: skip
    """The packing table: chats (TRL's ``bfd``) and long documents (its ``bfd_split``) beside the bound."""
    out = []
    docs = long_documents(documents)
    short = docs[:1_000]
    for name, data, strategy, long_docs, rows, size in (
        (f"{len(conversations):,} conversations (the `sft` recipe's rows)", conversations, "bfd", None, seq_len,
         batch_size),
        (f"{len(docs):,} long documents (lognormal, median 300, to 10k)", docs, "bfd_split", "split", seq_len,
         batch_size),
        (f"{len(short):,} of them in rows of 512, 8 a batch", short, "bfd_split", "split", 512, 8),
    ):  # fmt: skip
        lengths = np.array([len(d) for d in data])
        ours = packer_run(data, rows, size, long_docs)
        eff = padpipe_eff if strategy == "bfd" and padpipe_eff else ours["efficiency"]
        trl = trl_efficiency(data, rows, strategy) if has_trl else float("nan")
        trl_whole = trl_efficiency(data, rows, strategy, whole=True) if has_trl else float("nan")
        limit = bound(np.minimum(lengths, rows) if strategy == "bfd" else lengths, rows)
        out.append([
            name, f"`{strategy}`", f"{trl:.2%}", f"{trl_whole:.2%}", f"{eff:.2%}", f"{limit:.2%}",
            f"{100 * (eff - limit):+.2f}", f"{1e6 * ours['seconds'] / len(data):.1f}",
            f"{1e6 * ours['fill'] / len(data):.1f}", f"{ours['state'] / 1e6:.2f} MB",
        ])  # fmt: skip
    return out


PACKING_COLUMNS = (
    "data",
    "TRL strategy",
    "TRL (map batches of 1,000, as SFTTrainer)",
    "TRL (whole epoch at once)",
    "padpipe `pack()`",
    "bound",
    "padpipe - bound (points)",
    "packer us/doc",
    "of which planning rows us/doc",
    "packer state after 20 batches",
)

STEP_SCRIPT = r"""
import os, sys, time
sys.path.insert(0, {here!r})
os.environ["HF_HUB_OFFLINE"] = "1"; os.environ["PADPIPE_PROGRESS"] = "0"
import transformers
import sft_arms as arms

class Stop(transformers.TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        print("first step", flush=True)
        os._exit(0)

tok = arms.tokenizer({template!r} if {arm!r} == "trl" else None)
config = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, use_cache=False)
model = transformers.LlamaForCausalLM(config)
out = {out!r}
if {arm!r} == "trl":
    import datasets
    from trl import SFTConfig, SFTTrainer
    datasets.disable_progress_bars()
    data = datasets.Dataset.from_json({path!r}, cache_dir=out + "/cache")
    args = SFTConfig(out, max_length={seq_len}, packing=True, packing_strategy="bfd", assistant_only_loss=True,
                     per_device_train_batch_size={batch_size}, dataset_num_proc=2, report_to=[], use_cpu=True,
                     max_steps=1)
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tok, callbacks=[Stop()])
else:
    from padpipe.hf import Trainer
    from padpipe.recipes.sft import sft
    pipe = sft({path!r}, tok, seq_len={seq_len}, batch_size={batch_size}, chat_template={template!r})
    args = transformers.TrainingArguments(out, max_steps=1, report_to=[], use_cpu=True,
                                          remove_unused_columns=False)
    trainer = Trainer(model=model, args=args, train_dataset=pipe, callbacks=[Stop()])
trainer.train()
"""


def first_step(arm: str, path: str, template: str, seq_len: int, batch_size: int, out: str) -> float:
    """Seconds from starting ``python`` to the end of the arm's first optimizer step."""
    script = STEP_SCRIPT.format(here=str(HERE), template=template, arm=arm, path=path, seq_len=seq_len,
                                batch_size=batch_size, out=out)  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=900)
    seconds = time.perf_counter() - start
    if "first step" not in done.stdout:
        raise RuntimeError(f"{arm} did not reach its first step:\n{done.stderr[-3000:]}")
    return seconds


def first_step_rows(path: str, template: str, seq_len: int, batch_size: int, repeat: int, out: str,
                    first_batch: float, trl_pass: float) -> list[list[str]]:  # fmt: skip
    """Both figures: TRL's pre-pass against padpipe's first batch, and each script's start to its first step."""
    times = {"trl": [], "padpipe": []}  # type: dict[str, list[float]]
    for number in range(repeat):
        for arm in times:  # interleaved
            times[arm].append(first_step(arm, path, template, seq_len, batch_size, f"{out}/{arm}{number}"))
    trl, ours = statistics.median(times["trl"]), statistics.median(times["padpipe"])
    return [
        ["TRL pre-pass vs padpipe's first batch", f"{trl_pass:.2f}", f"{first_batch:.2f}",
         f"{trl_pass / first_batch:.1f}x"],
        ["script start to first optimizer step", f"{trl:.2f}", f"{ours:.2f}", f"{trl / ours:.1f}x"],
    ]  # fmt: skip
