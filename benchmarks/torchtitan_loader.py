"""padpipe's torchtitan loader vs torchtitan 0.3.0's own text loader, on the same corpus, tokenizer and batch shape.

Both are built as torchtitan's trainer builds its loader (``config.build(dp_world_size=1, dp_rank=0,
tokenizer=, seq_len=, local_batch_size=)``) with torchtitan's ``HuggingFaceTokenizer``, and read one
epoch in this process (``num_workers=0``; padpipe tokenizes in its default 2 threads, torchtitan one
document at a time). torchtitan: ``HuggingFaceTextDataLoader`` (``dataset="c4_test"`` pointed at a
folder holding the corpus, ``infinite=False``), which concatenates documents and cuts rows every
``seq_len`` tokens; padpipe: ``PadpipeDataLoader`` over the same files (shuffle buffer, best-fit
packing, documents longer than a row split). Reported per loader: seconds to build it and take the
first batch (the ``datasets`` Arrow cache of torchtitan's corpus made beforehand, untimed), seconds
for the epoch, input tokens per second (slots, and real tokens: not padding), the share of real
tokens and of trained tokens (label not -100) in the slots, and the rows that start inside a
document (a cut: the document's start is in another row, out of the model's view). Ratios come
from one run.

Usage:
    python benchmarks/torchtitan_loader.py             # the shipped corpus (5,000 documents), seq_len 2048 x 8
    python benchmarks/torchtitan_loader.py --repeat 4  # 20,000 documents (benchmarks/RESULTS.md)
    python benchmarks/torchtitan_loader.py --documents 1000 --seq-len 256 --batch-size 2   # a smoke run
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from torchtitan.components.tokenizer import HuggingFaceTokenizer  # noqa: E402
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader  # noqa: E402

import padpipe as pp  # noqa: E402
from padpipe.integrations.torchtitan import PadpipeDataLoader  # noqa: E402


def corpus(folder: Path, repeat: int, documents: int = 0) -> Path:
    """``folder/train.jsonl``: the shipped corpus (its first ``documents``; 0: all), ``repeat`` times."""
    with gzip.open(pp.examples.SAMPLE_JSONL, "rt") as f:
        lines = f.readlines()
    path = folder / "train.jsonl"
    path.write_text("".join(lines[:documents] if documents else lines) * repeat)
    return path


def measure(name: str, build, start_id: int, pad_id: int) -> dict:
    start = time.perf_counter()
    it = iter(build())
    first_batch, slots, real, trained, cuts, batches = None, 0, 0, 0, 0, 0
    for inputs, labels in it:
        if first_batch is None:
            first_batch = time.perf_counter() - start
        ids, positions = inputs["input"], inputs["positions"]
        batches += 1
        slots += ids.numel()
        padding = (ids == pad_id) & (labels == -100)
        real += int((~padding).sum())
        trained += int(labels.ne(-100).sum())
        cuts += int(((positions == 0) & (ids != start_id) & ~padding).sum())
    seconds = time.perf_counter() - start
    return dict(
        name=name,
        first=first_batch,
        seconds=seconds,
        batches=batches,
        slots=slots / seconds,
        real=real / seconds,
        real_share=real / slots,
        trained_share=trained / slots,
        cuts=cuts,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=1, help="the shipped corpus this many times")
    parser.add_argument("--documents", type=int, default=0, help="the corpus's first documents only (0: all 5,000)")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    workdir = Path(tempfile.mkdtemp(prefix="padpipe-titan-bench-"))
    os.environ["HF_DATASETS_CACHE"] = str(workdir / "hf-cache")
    try:
        (workdir / "corpus").mkdir()
        data = corpus(workdir / "corpus", args.repeat, args.documents)
        documents = sum(1 for _ in data.open())  # what was read: --documents past the corpus's 5,000 gives 5,000
        tokenizer = HuggingFaceTokenizer(tokenizer_path=pp.examples.TOKENIZER_DIR)
        start_id, pad_id = tokenizer.tokenizer.token_to_id("[CLS]"), tokenizer.tokenizer.token_to_id("[PAD]")
        shape = dict(dp_world_size=1, dp_rank=0, tokenizer=tokenizer, seq_len=args.seq_len)
        shape["local_batch_size"] = args.batch_size
        titan = HuggingFaceTextDataLoader.Config(dataset="c4_test", dataset_path=str(data.parent), infinite=False)
        ours = PadpipeDataLoader.Config(dataset_path=str(data))
        next(iter(titan.build(**shape)))  # datasets' Arrow cache of the corpus, made once, untimed
        rows = [
            measure("torchtitan HuggingFaceTextDataLoader", lambda: titan.build(**shape), start_id, pad_id),
            measure("padpipe PadpipeDataLoader", lambda: ours.build(**shape), start_id, pad_id),
        ]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    size = f"seq_len {args.seq_len} x {args.batch_size} rows"
    shipped = f"the shipped corpus's first {documents // args.repeat:,}" if args.documents else "the shipped corpus"
    print(f"{documents:,} documents ({shipped} x{args.repeat}), {size}")
    print()
    columns = ["loader", "build + 1st batch (s)", "epoch (s)", "batches", "slots/s", "real tokens/s", "real tokens"]
    print("| " + " | ".join([*columns, "trained", "rows cut"]) + " |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['name']} | {r['first']:.2f} | {r['seconds']:.2f} | {r['batches']} | {r['slots']:,.0f} | "
            f"{r['real']:,.0f} | {r['real_share']:.1%} | {r['trained_share']:.1%} | {r['cuts']:,} |"
        )
    titan_row, ours_row = rows
    print()
    print(
        f"padpipe / torchtitan: {ours_row['real'] / titan_row['real']:.2f}x the real tokens/s, "
        f"{ours_row['slots'] / titan_row['slots']:.2f}x the slots/s, "
        f"{ours_row['first'] / titan_row['first']:.2f}x the time to the first batch"
    )


if __name__ == "__main__":
    main()
