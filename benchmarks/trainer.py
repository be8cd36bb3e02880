"""Inside HF Trainer: padpipe against what HF and TRL ship, on the same tiny models, data and token budget.

Two tasks, CPU, torch 2 threads, each arm in its own process (so peak RSS is its own; ``--one-process``, for
smoke runs, runs them in turn in one):

- ``cls``: a BERT pair classifier (hidden 128, 2 layers) on the shipped sentence pairs
  (``max_length=128``, 32 rows a step; the first 1,000 pairs held out);
- ``lm``: a Llama-style causal LM (hidden 64, 2 layers, sdpa) on documents the script generates
  (default 50,000, log-normal sentence counts drawn from the shipped corpus; truncated to 512
  tokens, 8 documents a step; 200 more documents held out).

Arms (``trainer_arms.py``): HF ``Trainer`` with random batches and a padding collator after
``datasets.map(num_proc=2)``; with ``train_sampling_strategy="group_by_length"`` and
``"batch_rebalance"`` (4 accumulation steps of a quarter batch); ``DataCollatorWithFlattening``
(lm); TRL ``SFTTrainer`` with ``packing_strategy="bfd"`` (lm); ``padpipe.hf.Trainer`` with
``bucket(max_tokens)`` + ``pad``, the same in accumulation steps (``batch_rebalance``'s step shape:
the budget split into up to 4 micro-batches that still hold a ``max_length`` row) and with
``pack(512)`` (lm). padpipe's token budget and the packed batch size are set so that a step holds
about as many real tokens as the HF arms' steps.
Every arm trains the same seeded model with the same constant learning rate until it has
trained on ``--cls-tokens``/``--lm-tokens`` real tokens. Reported per arm: seconds from the start
of its data preparation to the end of its first optimizer step, steady real tokens/s and rows/s
(after the first steps; their mean; and end to end: every real token over the seconds from the
start of data preparation, ``map`` included, to the last step), padding efficiency (real tokens
over the slots the model computed on), peak RSS, and the held-out loss after training (the same
batches for every arm).

Usage:
    python benchmarks/trainer.py [--chart benchmarks/out/trainer.png]
    python benchmarks/trainer.py --quick            # small sizes, a minute or two
    python benchmarks/trainer.py --ranks 2 --arms hf_random hf_batch_rebalance padpipe_bucket
                                                    # each arm under torchrun x2 (gloo, 1 thread a rank)
    python benchmarks/trainer.py --repeat 3         # every arm 3 times, interleaved; the median run of each
    python benchmarks/trainer.py --tokenize-threads 1   # padpipe tokenizes in the training thread (no helpers)
    python benchmarks/trainer.py --quick --one-process  # a smoke run: every arm in one process, imports once

Under ``--ranks R`` every arm is one ``torchrun --standalone --nproc_per_node=R`` launch: each rank
takes its per-device batch, tokens are summed over the ranks at every step (so the token budget and
the rates are the whole job's), and rank 0 reports. ``batch_rebalance`` then balances the padded
cost across ranks as well as accumulation steps; padpipe's token-budget batches are equal in cost
by construction.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PADPIPE_PROGRESS", "0")

import trainer_arms as arms  # noqa: E402
import trainer_setup as setup  # noqa: E402

COLUMNS = (
    "task",
    "arm",
    "1st batch (s)",
    "1st step (s)",
    "steady tokens/s",
    "mean tokens/s",
    "end-to-end tokens/s",
    "rows/s",
    "tokens/row",
    "padding eff.",
    "peak RSS (MiB)",
    "held-out loss",
    "tokens",
    "steps",
)


def run_arm(cfg: dict[str, Any]) -> dict[str, Any]:
    """One arm, in this process: build, train to the budget, measure (the ``--arm`` entry point)."""
    import torch
    import transformers  # noqa: F401  imported before the clock starts, as in every arm

    import padpipe.hf  # noqa: F401

    if cfg["arm"].startswith("trl"):
        import trl  # noqa: F401
    torch.set_num_threads(cfg["threads"])
    tok = setup.tokenizer(cfg["task"])
    net = setup.model(cfg["task"], len(tok), cfg["seed"])
    meter = setup.Meter(cfg["budget"])
    arms.build(cfg, net, tok, meter).train()
    result = meter.result()
    if os.environ.get("RANK", "0") != "0":  # under torchrun rank 0 reports for all
        return {}
    result["loss"] = setup.held_out_loss(net, cfg["task"], cfg["held_out"], tok, cfg["max_length"])
    result["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["children_rss_mib"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return result


def spawn(cfgs: list[dict[str, Any]], timeout: float) -> list[dict[str, Any]]:
    """Run arms (one, or all under ``--one-process``) in turn in a fresh process; each one's result, or for each
    the error the process ended with."""
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={cfgs[0]['ranks']}"]
    script = [os.path.abspath(__file__), "--arm", json.dumps(cfgs)]
    cmd = [sys.executable, *(launcher if cfgs[0]["ranks"] > 1 else []), *script]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [{"error": f"timed out after {timeout:.0f} s"}] * len(cfgs)
    lines = [x[len("RESULT ") :] for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if done.returncode or len(lines) != len(cfgs):
        return [{"error": (done.stderr.strip().splitlines() or ["no output"])[-1][:200]}] * len(cfgs)
    return [json.loads(line) for line in lines]


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median steady tokens/s (so every figure in its row is from one real run); an error if all failed.

    Example:
        >>> median_run([{"tokens_per_s": 3.0}, {"error": "x"}, {"tokens_per_s": 1.0}, {"tokens_per_s": 2.0}])
        {'tokens_per_s': 2.0}
    """
    done = sorted((r for r in runs if "error" not in r), key=lambda r: r["tokens_per_s"])
    return done[(len(done) - 1) // 2] if done else runs[-1]


def mean_length(cfg: dict[str, Any], rows: int = 2000) -> float:
    """Mean tokens per row (truncated) over the training file's first rows: sets padpipe's batch sizes."""
    import pyarrow.parquet as pq

    tok = setup.tokenizer(cfg["task"])
    table = pq.read_table(cfg["train"]).slice(0, rows)
    texts = [table.column(f).to_pylist() for f in (setup.FIELDS if cfg["task"] == "cls" else ("text",))]
    enc = tok(*texts, truncation=True, max_length=cfg["max_length"])["input_ids"]
    return sum(map(len, enc)) / len(enc)


def micro_budget(max_tokens: int, max_length: int, accum: int = 4) -> dict[str, int]:
    """``padpipe_bucket_accum``'s split of a step's token budget into (up to) ``accum`` micro-batches, as
    ``batch_rebalance`` takes 4 accumulation steps of a quarter batch; a micro-batch still holds one
    ``max_length`` row, so fewer, larger ones where a quarter of the budget would not.

    Example:
        >>> micro_budget(1511, 512), micro_budget(2377, 128)
        ({'accum_steps': 3, 'micro_tokens': 512}, {'accum_steps': 4, 'micro_tokens': 594})
    """
    steps = max(1, min(accum, round(max_tokens / max_length)))
    return {"accum_steps": steps, "micro_tokens": max(max_length, round(max_tokens / steps))}


def configs(args: argparse.Namespace, work: str) -> list[dict[str, Any]]:
    """The arm configurations of every task asked for, data written to ``work``."""
    out = []
    threads = max(1, args.threads // args.ranks)  # the ranks share the cores
    common = {
        "seed": args.seed,
        "threads": threads,
        "bucket_buffer": args.bucket_buffer,
        "ranks": args.ranks,
        "tokenize_threads": args.tokenize_threads,
    }
    if "cls" in args.tasks:
        cls = {"task": "cls", "train": f"{work}/pairs.parquet", "held_out": f"{work}/pairs-eval.parquet"}
        setup.write_pairs(cls["train"], cls["held_out"], args.cls_rows, args.eval_rows)
        cls.update(common, budget=args.cls_tokens, batch_size=32, max_length=128, lr=5e-4, seq_len=128, pack_rows=1)
        cls["max_tokens"] = max(128, round(32 * mean_length(cls)))
        cls.update(micro_budget(cls["max_tokens"], cls["max_length"]))
        out += [{**cls, "arm": a} for a in arms.CLS_ARMS]
    if "lm" in args.tasks:
        lm = {"task": "lm", "train": f"{work}/docs.parquet", "held_out": f"{work}/docs-eval.parquet"}
        start = time.perf_counter()
        setup.write_docs(lm["train"], args.docs, args.median_sentences, 1.0, args.seed)
        setup.write_docs(lm["held_out"], args.eval_docs, args.median_sentences, 1.0, args.seed + 1)
        print(f"generated {args.docs:,} documents in {time.perf_counter() - start:.1f} s", flush=True)
        lm.update(common, budget=args.lm_tokens, batch_size=8, max_length=512, lr=1e-3, seq_len=512)
        mean = mean_length(lm)
        lm.update(max_tokens=max(512, round(8 * mean)), pack_rows=max(1, round(8 * mean / 512)))
        lm.update(micro_budget(lm["max_tokens"], lm["max_length"]))
        out += [{**lm, "arm": a} for a in arms.LM_ARMS]
    if importlib.util.find_spec("trl") is None:
        print("trl is not installed (pip install '.[bench]'): the TRL arm is left out")
        out = [c for c in out if not c["arm"].startswith("trl")]
    return [c for c in out if not args.arms or c["arm"] in args.arms]


def table(results: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[str]:
    """The markdown table of every arm (an arm that failed shows its error)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for cfg, r in results:
        head = [cfg["task"], arms.LABELS[cfg["arm"]]]
        if "error" in r:
            lines.append("| " + " | ".join(head + [f"failed: {r['error']}"] + [""] * (len(COLUMNS) - 3)) + " |")
            continue
        cells = [
            f"{r['first_batch_s']:.2f}",
            f"{r['first_step_s']:.2f}",
            f"{r['tokens_per_s']:,.0f}",
            f"{r['mean_tokens_per_s']:,.0f}",
            f"{r['tokens'] / r['train_s']:,.0f}",
            f"{r['rows_per_s']:,.1f}",
            f"{r['tokens'] / max(1, r['rows']):.0f}",
            f"{r['efficiency']:.3f}",
            f"{r['rss_mib']:,.0f}",
            f"{r['loss']:.4f}",
            f"{r['tokens']:,}",
            f"{r['steps']:,}",
        ]
        lines.append("| " + " | ".join(head + cells) + " |")
    return lines


def ratios(results: list[tuple[dict[str, Any], dict[str, Any]]]) -> list[str]:
    """Per task: padpipe's best steady tokens/s over the best HF/TRL arm's, and first step vs the pre-pass arms."""
    lines = []
    for task in dict.fromkeys(c["task"] for c, _ in results):
        done = [(c["arm"], r) for c, r in results if c["task"] == task and "error" not in r]
        ours = [(a, r) for a, r in done if a.startswith("padpipe")]
        theirs = [(a, r) for a, r in done if not a.startswith("padpipe")]
        if not ours or not theirs:
            continue
        best_ours = max(ours, key=lambda x: x[1]["tokens_per_s"])
        best_theirs = max(theirs, key=lambda x: x[1]["tokens_per_s"])
        soonest = min(r["first_step_s"] for _, r in ours)
        fastest_prepass = min(theirs, key=lambda x: x[1]["first_step_s"])
        lines.append(
            f"{task}: steady tokens/s, best padpipe ({best_ours[0]}) / best HF-TRL ({best_theirs[0]}): "
            f"{best_ours[1]['tokens_per_s'] / best_theirs[1]['tokens_per_s']:.2f}x; "
            f"first step {fastest_prepass[1]['first_step_s'] / soonest:.1f}x sooner than the soonest "
            f"pre-pass arm ({fastest_prepass[0]})"
        )
    return lines


def chart(results: list[tuple[dict[str, Any], dict[str, Any]]], path: str) -> None:
    """Steady tokens/s and first-step seconds of every arm, one row of panels per task."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(c["task"] for c, _ in results))
    fig, axes = plt.subplots(len(tasks), 2, figsize=(12, 2.2 + 0.45 * len(results)), squeeze=False)
    for row, task in zip(axes, tasks):
        done = [(arms.LABELS[c["arm"]], r, c["arm"]) for c, r in results if c["task"] == task and "error" not in r]
        names = [n for n, _, _ in done]
        colors = ["#dd8452" if a.startswith("padpipe") else "#4c72b0" for _, _, a in done]
        for ax, key, label in zip(row, ("tokens_per_s", "first_step_s"), ("steady real tokens/s", "1st step (s)")):
            ax.barh(names, [r[key] for _, r, _ in done], color=colors)
            ax.set_xlabel(f"{task}: {label}")
            ax.invert_yaxis()
        row[1].set_xscale("log")
        row[1].xaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))  # 1, 2, 5, 10, 20, ...
        row[1].xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        row[1].xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # no overlapping 2x10^0, 3x10^0 labels
        row[1].set_yticklabels([])
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"chart: {path}")


def main(argv: Sequence[str] | None = None) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm", help=argparse.SUPPRESS)  # internal: run arms (JSON configs) and print their results
    parser.add_argument("--quick", action="store_true", help="small sizes (a minute or two)")
    parser.add_argument("--tasks", nargs="+", default=["cls", "lm"], choices=["cls", "lm"])
    parser.add_argument("--arms", nargs="+", help="only these arms (names in trainer_arms.py)")
    parser.add_argument("--docs", type=int, default=50_000, help="generated training documents (lm)")
    parser.add_argument("--median-sentences", type=float, default=8.0)
    parser.add_argument("--eval-docs", type=int, default=200)
    parser.add_argument("--cls-rows", type=int, default=0, help="training pairs (0: all 19,000)")
    parser.add_argument("--eval-rows", type=int, default=1000)
    parser.add_argument("--cls-tokens", type=int, default=40_000, help="real tokens each cls arm trains on")
    parser.add_argument("--lm-tokens", type=int, default=20_000, help="real tokens each lm arm trains on")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (shared by the ranks)")
    parser.add_argument("--ranks", type=int, default=1, help="run each arm under torchrun with this many ranks (gloo)")
    parser.add_argument("--bucket-buffer", type=int, default=10_000, help="padpipe bucket(buffer_size=...)")
    parser.add_argument(
        "--tokenize-threads", type=int, default=2, help="padpipe tokenize(num_threads=...); 2 is padpipe's default"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=1, help="run every arm this many times, interleaved")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per arm")
    parser.add_argument(
        "--one-process",
        action="store_true",
        help="every arm in one process, in turn (a smoke run: imports once; the figures are not each arm's own)",
    )
    parser.add_argument("--chart", help="write the PNG chart here")
    parser.add_argument("--workdir", help="where the corpora go (default: a temporary folder)")
    args = parser.parse_args(argv)
    if args.arm:
        for cfg in json.loads(args.arm):
            result = run_arm(cfg)
            if result:
                print("RESULT " + json.dumps(result), flush=True)
        return []
    if args.one_process and args.ranks > 1:
        parser.error("--one-process runs the arms in one process, not under torchrun: leave out --ranks")
    if args.quick:
        args.docs, args.eval_docs, args.eval_rows = (
            min(args.docs, 3000),
            min(args.eval_docs, 48),
            min(args.eval_rows, 128),
        )
        args.cls_rows = min(args.cls_rows or 3000, 3000)
        args.cls_tokens, args.lm_tokens = min(args.cls_tokens, 30_000), min(args.lm_tokens, 20_000)
    work = args.workdir or tempfile.mkdtemp(prefix="padpipe-trainer-")
    os.makedirs(work, exist_ok=True)
    arms_cfg = configs(args, work)
    runs: list[list[dict[str, Any]]] = [[] for _ in arms_cfg]
    groups = [list(range(len(arms_cfg)))] if args.one_process else [[i] for i in range(len(arms_cfg))]
    for round_ in range(args.repeat):  # interleaved: a load change on the machine hits every arm alike
        for group in groups:
            start = time.perf_counter()
            for i, result in zip(group, spawn([arms_cfg[i] for i in group], args.timeout * len(group))):
                runs[i].append(result)
            names = ", ".join(f"{arms_cfg[i]['task']} {arms_cfg[i]['arm']}" for i in group)
            print(f"  {names} (run {round_ + 1}): {time.perf_counter() - start:.0f} s", flush=True)
    results = [(cfg, median_run(done)) for cfg, done in zip(arms_cfg, runs)]
    ranks = f", torchrun x{args.ranks} (tokens, rows and slots summed over ranks)" if args.ranks > 1 else ""
    print(
        f"\ntorch threads={args.threads}{ranks}; budgets in real tokens: cls {args.cls_tokens:,}, lm {args.lm_tokens:,}"
    )
    for task in dict.fromkeys(c["task"] for c, _ in results):
        c = next(c for c, _ in results if c["task"] == task)
        print(
            f"{task}: padpipe tokenize(num_threads={c['tokenize_threads']}), bucket(max_tokens={c['max_tokens']:,}), "
            f"{c['accum_steps']} accumulation steps of bucket(max_tokens={c['micro_tokens']:,}), "
            f"pack(seq_len={c['seq_len']}, batch_size={c['pack_rows']})"
        )
    if args.repeat > 1:
        print(f"\nthe run of median steady tokens/s of {args.repeat} interleaved runs per arm (all runs' rates):")
        for cfg, done in zip(arms_cfg, runs):
            rates = ", ".join(f"{r['tokens_per_s']:,.0f}" if "error" not in r else "failed" for r in done)
            print(f"  {cfg['task']} {cfg['arm']}: {rates}")
    print("\n" + "\n".join(table(results)))
    print("\n" + "\n".join(ratios(results)))
    if args.chart:
        chart(results, args.chart)
    return results


if __name__ == "__main__":
    main()
