"""Preference (DPO) data beside TRL: the same pairs through TRL's ``DPOTrainer`` data path and padpipe's ``dpo`` recipe.

On ``--pairs`` pairs made from the shipped text (``pp.examples.preferences``) and the shipped ChatML tokenizer:

- TRL: ``DPOTrainer._prepare_dataset`` (its ``map`` pre-pass: tokenizing every pair, the prefix check) on the pairs
  in memory, then its ``DataCollatorForPreference`` on the first ``--batch-size`` pairs: seconds to the first batch;
  then every batch of an epoch in a random order (TRL's default sampler): real tokens (attention mask) and slots
  (rows x longest row) per batch;
- padpipe, from the JSON Lines file: ``dpo(mode="pack")`` (pairs packed into ``--rows`` rows of ``--seq-len``) and
  ``dpo(mode="pad")`` (``--batch-size`` pairs of similar length a batch, TRL's layout): seconds to the first batch
  (the median of ``--repeat`` fresh loaders), and real tokens and slots per batch over an epoch;
- each pair's ids and completion masks, padpipe's against TRL's.

Model compute is not counted. Usage:
    python benchmarks/dpo.py [--pairs 10000] [--batch-size 8] [--seq-len 2048] [--rows 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import types
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PADPIPE_PROGRESS", "0")

import torch  # noqa: E402

import padpipe as pp  # noqa: E402
from padpipe.recipes.dpo import dpo  # noqa: E402


def trl_path(rows: list[dict[str, Any]], tok: Any, batch_size: int, seed: int) -> dict[str, Any]:
    """TRL's pre-pass and collator: seconds to the first batch, and an epoch's batches in a random order."""
    import datasets
    import trl
    from trl.trainer.dpo_trainer import DataCollatorForPreference, DPOTrainer

    start = time.perf_counter()
    data = datasets.Dataset.from_list([{k: v for k, v in r.items() if k != "id"} for r in rows])
    config = trl.DPOConfig(tempfile.mkdtemp(), max_length=None, use_cpu=True, bf16=False, report_to=[])
    prepared = DPOTrainer._prepare_dataset(types.SimpleNamespace(_tokenizer=tok), data, tok, config, "train")
    collate = DataCollatorForPreference(pad_token_id=tok.pad_token_id)
    collate([prepared[i] for i in range(batch_size)])
    first = time.perf_counter() - start
    order = torch.randperm(len(prepared), generator=torch.Generator().manual_seed(seed)).tolist()
    real = slots = batches = 0
    for k in range(0, len(order), batch_size):
        batch = collate([prepared[i] for i in order[k : k + batch_size]])
        real, slots, batches = (
            real + int(batch["attention_mask"].sum()),
            slots + batch["input_ids"].numel(),
            batches + 1,
        )
    return {"first": first, "real": real, "slots": slots, "batches": batches, "rows": list(prepared)}


def padpipe_path(path: str, tok: Any, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """padpipe's recipe: seconds to the first batch (median of fresh loaders), and an epoch's real tokens and slots."""
    size = args.rows if mode == "pack" else args.batch_size
    max_length = args.seq_len // 2 if mode == "pack" else args.seq_len

    def pipe() -> pp.Pipeline:
        return dpo(path, tok, seq_len=args.seq_len, mode=mode, batch_size=size, max_length=max_length, seed=args.seed)

    firsts = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        next(iter(pipe().loader()))
        firsts.append(time.perf_counter() - start)
    loader = pipe().loader()
    for _ in loader:
        pass
    stats = loader.stats()
    return {"first": statistics.median(firsts), "real": stats.real_tokens, "slots": stats.padded_tokens,
            "batches": stats.batches}  # fmt: skip


def same_as_trl(path: str, tok: Any, trl_rows: list[dict[str, Any]]) -> tuple[int, int]:
    """Pairs whose ids and completion masks (both members) are TRL's, and pairs in all."""
    pipe = pp.read_jsonl(path).preference(tok).batch(256).pad()
    ours = {}
    for batch in pipe.loader():
        for i in range(len(batch["chosen"])):
            real = batch["attention_mask"][i].bool()
            key = (int(batch["id"][i]), bool(batch["chosen"][i]))
            ours[key] = (batch["input_ids"][i][real].tolist(), batch["completion_mask"][i][real].tolist())
    same = 0
    for i, row in enumerate(trl_rows):
        theirs = [(row["prompt_ids"] + row[f"{m}_ids"], [0] * len(row["prompt_ids"]) + [1] * len(row[f"{m}_ids"]))
                  for m in ("chosen", "rejected")]  # fmt: skip
        same += [ours[i, True], ours[i, False]] == theirs
    return same, len(trl_rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=10_000)
    parser.add_argument("--batch-size", type=int, default=8, help="pairs per padded batch (TRL's and padpipe's)")
    parser.add_argument("--seq-len", type=int, default=2048, help="tokens per packed row")
    parser.add_argument("--rows", type=int, default=8, help="packed rows per batch")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    tok = pp.examples.chat_tokenizer()
    rows = pp.examples.preferences(args.pairs, seed=args.seed)
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "pairs.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    results = {"TRL (pre-pass, padded)": trl_path(rows, tok, args.batch_size, args.seed)}
    results["padpipe packed"] = padpipe_path(path, tok, "pack", args)
    results["padpipe padded (bucketed)"] = padpipe_path(path, tok, "pad", args)
    print(f"{args.pairs} pairs, {args.batch_size} pairs a padded batch, packed {args.rows} x {args.seq_len}:")
    print("| data path | first batch (s) | batches | real tokens / batch | slots / batch | real / slots |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['first']:.2f} | {r['batches']} | {r['real'] / r['batches']:,.0f} | "
              f"{r['slots'] / r['batches']:,.0f} | {r['real'] / r['slots']:.1%} |")  # fmt: skip
    same, total = same_as_trl(path, tok, results["TRL (pre-pass, padded)"]["rows"])
    print(f"pairs whose ids and completion masks are TRL's: {same} of {total}")


if __name__ == "__main__":
    main()
