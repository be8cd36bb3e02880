"""Chat SFT beside TRL: the same conversations through TRL's ``SFTTrainer`` data path and padpipe's ``sft`` recipe.

On ``--conversations`` conversations made from the shipped text (``pp.examples.conversations``), the shipped
byte-level BPE chat tokenizer and the templates of ``sft_arms.py``, for each template and data form:

- TRL: the ``SFTTrainer`` constructor's pre-pass (template, labels, BFD packing; ``assistant_only_loss=True``
  for ``messages`` rows, ``completion_only_loss`` for prompt/completion rows), timed; its packed rows;
- padpipe: ``padpipe.recipes.sft.sft`` streaming the same rows: seconds to the first packed batch (the
  median of ``--repeat``), then one epoch with each conversation's id kept;
- each conversation's trained labels, padpipe's against TRL's (for those that fit ``--seq-len``, and for
  those cut to it), the tokens one trains that the other does not, and packing efficiency (real tokens
  over rows x row length) of both.

Then tokenizing rates on ``--rate-conversations`` conversations in batches of 1,000 (the best of
``--rate-rounds`` interleaved rounds, as other work on the machine only slows a round down):
``apply_chat_template(..., return_assistant_tokens_mask=True)`` against padpipe's chat stage on one
thread and ``.chat()`` in a pipeline (its default 2 threads), for a marked template and for the
prefix-rendering path (a template without markers); and padpipe's ``pack_buffer`` against first batch,
packing efficiency and state size. Model compute is not counted anywhere.

Usage:
    python benchmarks/sft.py [--conversations 20000] [--seq-len 1024] [--chart benchmarks/out/sft.png]
    python benchmarks/sft.py --conversations 300 --rate-conversations 300 --buffers 64   # quick; no TRL needed
    python benchmarks/sft.py --conversations 10000 --batch-size 4 --sections packing steps   # two sections

Without ``trl`` installed (``pip install 'padpipe[bench]'``) the TRL columns read "not installed".
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pickle
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PADPIPE_PROGRESS", "0")

import pyarrow as pa  # noqa: E402
import sft_arms as arms  # noqa: E402
import sft_packing  # noqa: E402

import padpipe as pp  # noqa: E402
from padpipe.chat.options import ChatOptions  # noqa: E402
from padpipe.chat.template import ChatTemplate  # noqa: E402
from padpipe.pipes.chat import ChatTokenizer  # noqa: E402
from padpipe.recipes.sft import sft  # noqa: E402

HAS_TRL = importlib.util.find_spec("trl") is not None
COLUMNS = (
    "template",
    "rows",
    "TRL pre-pass (s)",
    "padpipe 1st batch (s)",
    "sooner",
    "TRL packing eff.",
    "padpipe packing eff.",
    "labels equal (fit)",
    "labels equal (cut)",
    "trained by TRL only",
    "trained by padpipe only",
    "dropped by padpipe",
)


def case_row(case: arms.Case, paths: dict[str, str], args: argparse.Namespace) -> tuple[list[str], dict[str, Any]]:
    """One table row: TRL's pre-pass and packed rows, padpipe's first batch and epoch, the labels compared."""
    path = paths[case.form]
    trl = arms.trl_arm(case, path, args.seq_len, args.batch_size) if HAS_TRL else None
    first = arms.first_batch(case, path, args.seq_len, args.batch_size, args.pack_buffer, args.repeat)
    ours = arms.padpipe_arm(case, path, args.seq_len, args.batch_size, args.pack_buffer)
    dropped = sum(ours["stats"].skipped.values())
    name = f"`{case.name}`" + (", prompt/completion" if case.form == "prompt_completion" else "")
    cells = [name, f"{len(ours['conversations']) + dropped:,}"]
    result: dict[str, Any] = {"case": case, "first": first, "padpipe_eff": ours["efficiency"], "trl": trl}
    result["lengths_of"] = [ids for _, (ids, _) in sorted(ours["conversations"].items())]
    if trl is None or "refused" in trl:
        reason = "not installed" if trl is None else f"refused: {trl['refused']}"
        cells += [reason, f"{first:.2f}", "", "", f"{ours['efficiency']:.2%}", "", "", "", "", f"{dropped:,}"]
        return cells, result
    found = arms.compare(ours, trl, args.seq_len, arms.tokenizer(None))
    result.update(found, trl_seconds=trl["seconds"], trl_eff=trl["efficiency"])
    cells += [
        f"{trl['seconds']:.2f}",
        f"{first:.2f}",
        f"{trl['seconds'] / first:.0f}x",
        f"{trl['efficiency']:.2%}",
        f"{ours['efficiency']:.2%}",
        f"{found['fit_equal']:,} of {found['fit']:,}",
        f"{found['cut_equal']:,} of {found['cut']:,}",
        tokens(found["only_trl"]),
        tokens(found["only_padpipe"]),
        f"{dropped:,}"
        + (f" (TRL keeps {found['trl_only']:,}: {found['trl_only_untrained']:,} train nothing)" if dropped else ""),
    ]
    return cells, result


def tokens(counts: Any) -> str:
    """The tokens one side trains and the other does not, most common first: ``'Ċ' x 51,204``."""
    if not counts:
        return "none"
    return ", ".join(f"{token!r} x {n:,}" for token, n in counts.most_common(3))


def rates(path: str, n: int, rounds: int) -> list[list[str]]:
    """Conversations per second tokenized with labels: HF's batch call against padpipe's stage and pipeline."""
    rows = pa.Table.from_pylist(pp.examples.conversations(n, seed=1))
    batches = rows.to_batches(max_chunksize=1000)
    conversations = [batch.column("messages").to_pylist() for batch in batches]
    marked, plain = arms.tokenizer(arms.LLAMA3_MARKED), arms.tokenizer(None)
    subset = str(Path(path).with_name("rates.jsonl"))
    with open(path) as source, open(subset, "w") as out:
        out.writelines(line for line, _ in zip(source, range(n)))

    def hf(tok: Any, mask: bool) -> Callable[[], None]:
        return lambda: [
            tok.apply_chat_template(c, tokenize=True, return_dict=True, return_assistant_tokens_mask=mask)
            for c in conversations
        ]

    def stage(tok: Any) -> Callable[[], None]:
        fn = ChatTokenizer(ChatTemplate(tok), ChatOptions())
        return lambda: [fn(batch) for batch in batches]

    def pipeline(tok: Any) -> Callable[[], None]:
        def run() -> None:
            node = pp.read_jsonl(subset).chat(tok).build()
            node.reset(None)
            for _ in node:
                pass

        return run

    arms_ = {
        "marked (`llama3_marked`): HF `apply_chat_template(..., return_assistant_tokens_mask=True)`": hf(marked, True),
        "marked: padpipe chat stage, one thread (its spans from the `{% generation %}` markers)": stage(marked),
        "marked: padpipe `read_jsonl(...).chat(tok)`, 2 threads (the default)": pipeline(marked),
        "no markers (`chatml`): HF `apply_chat_template(...)`, ids only (no labels: it cannot make them)": hf(
            plain, False
        ),
        "no markers: padpipe chat stage, one thread (spans by rendering prefixes)": stage(plain),
        "no markers: padpipe `read_jsonl(...).chat(tok)`, 2 threads": pipeline(plain),
    }
    times: dict[str, list[float]] = {name: [] for name in arms_}
    for _ in range(rounds):
        for name, run in arms_.items():  # interleaved, so a busy moment hits every arm alike
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    base = n / min(next(iter(times.values())))
    out = []
    for name, seconds in times.items():
        rate = n / min(seconds)  # the best round: other work on the machine only ever slows a round down
        out.append([name, f"{rate:,.0f}", f"{rate / base:.2f}"])
    return out


def buffers(path: str, args: argparse.Namespace) -> list[list[str]]:
    """padpipe's ``pack_buffer``: first batch, packing efficiency, and a state's size after 20 batches."""
    case = arms.CASES[0]
    out = []
    for size in args.buffers:
        first = arms.first_batch(case, path, args.seq_len, args.batch_size, size, args.repeat)
        pipe = sft(
            path, arms.tokenizer(case.template), seq_len=args.seq_len, batch_size=args.batch_size, pack_buffer=size
        )
        loader = pipe.loader()
        state = b""
        for number, _ in enumerate(loader):
            if number == 19:
                state = pickle.dumps(loader.state_dict())
        eff = loader.stats().padding_efficiency
        out.append([f"{size:,}", f"{first:.2f}", f"{eff:.2%}", f"{len(state) / 1e6:.1f} MB" if state else "-"])
    return out


def table(header: Sequence[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def chart(results: list[dict[str, Any]], path: str) -> None:
    """Seconds before the first batch (TRL's pre-pass, padpipe's first batch) and packing efficiency per case."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [f"{r['case'].name}\n{r['case'].form}" for r in results]
    x = range(len(results))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.bar([i - 0.2 for i in x], [r.get("trl_seconds", 0) for r in results], 0.4, label="TRL pre-pass")
    left.bar([i + 0.2 for i in x], [r["first"] for r in results], 0.4, label="padpipe first batch")
    left.set_ylabel("seconds before the first batch")
    right.bar([i - 0.2 for i in x], [100 * r.get("trl_eff", 0) for r in results], 0.4, label="TRL BFD")
    right.bar([i + 0.2 for i in x], [100 * r["padpipe_eff"] for r in results], 0.4, label="padpipe pack()")
    right.set_ylim(97, 100)
    right.set_ylabel("packing efficiency (%)")
    for ax in (left, right):
        ax.set_xticks(list(x), names, fontsize=7)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=20_000, help="conversations per case (default 20,000)")
    parser.add_argument(
        "--seq-len", type=int, default=1024, help="packed row length and max_length (default 1024, TRL's max_length)"
    )
    parser.add_argument("--batch-size", type=int, default=8, help="packed rows per batch (default 8)")
    parser.add_argument("--pack-buffer", type=int, default=256, help="padpipe's pack_buffer (default: the recipe's)")
    parser.add_argument("--buffers", type=int, nargs="*", default=[64, 256, 1024, 2048], help="pack_buffer sweep")
    parser.add_argument("--rate-conversations", type=int, default=5000, help="conversations for the rates")
    parser.add_argument("--repeat", type=int, default=3, help="first batches per case (the median)")
    parser.add_argument("--rate-rounds", type=int, default=5, help="interleaved rounds of the rates (the best)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the conversations")
    parser.add_argument("--chart", help="write a PNG chart here")
    parser.add_argument(
        "--sections",
        nargs="*",
        default=["cases", "packing", "steps", "rates", "buffers"],
        help="what to run: cases (the table beside TRL), packing (beside TRL's and the bound), steps (script start "
        "to first optimizer step), rates, buffers (default: all)",
    )
    parser.add_argument("--documents", type=int, default=20_000, help="long documents of the packing section")
    parser.add_argument("--step-repeat", type=int, default=2, help="processes per arm of the steps section (median)")
    args = parser.parse_args(argv)
    import torch
    import transformers  # noqa: F401  imported before any clock starts

    if HAS_TRL:
        import trl  # noqa: F401
    torch.set_num_threads(2)
    work = Path(tempfile.mkdtemp(prefix="padpipe-sft-bench-"))
    paths = arms.write_data(work, args.conversations, args.seed)
    trl_version = trl.__version__ if HAS_TRL else "not installed"
    print(
        f"{args.conversations:,} conversations (pp.examples.conversations, seed {args.seed}), seq_len {args.seq_len}, "
        f"{args.batch_size} rows a batch, pack_buffer {args.pack_buffer}, cores {os.cpu_count()}; "
        f"trl {trl_version}, transformers {transformers.__version__}\n"
    )
    rows, results = [], []
    for case in arms.CASES if "cases" in args.sections else ():
        cells, result = case_row(case, paths, args)
        rows.append(cells)
        results.append(result)
        print(f"  {cells[0]}: done", file=sys.stderr, flush=True)
    if results:
        print(table(COLUMNS, rows) + "\n")
    for r in results:
        if "trl_seconds" in r:
            fit = "yes" if r["fit_equal"] == r["fit"] else f"no ({r['fit'] - r['fit_equal']:,} differ)"
            print(
                f"{r['case'].name} {r['case'].form}: labels of every conversation that fits equal TRL's: {fit}; "
                f"first batch {r['trl_seconds'] / r['first']:.0f}x sooner than TRL's pre-pass ends; packing "
                f"efficiency {100 * (r['padpipe_eff'] - r['trl_eff']):+.2f} points vs TRL's BFD"
            )
    print()
    if "packing" in args.sections:
        first_case = results[0] if results else None
        if first_case is None:
            ours = arms.padpipe_arm(arms.CASES[0], paths["messages"], args.seq_len, args.batch_size, args.pack_buffer)
            first_case = {"lengths_of": [ids for _, (ids, _) in sorted(ours["conversations"].items())],
                          "padpipe_eff": ours["efficiency"]}  # fmt: skip
        packing = sft_packing.packing_rows(
            first_case["lengths_of"], args.seq_len, args.batch_size, HAS_TRL, first_case["padpipe_eff"], args.documents
        )
        print(table(sft_packing.PACKING_COLUMNS, packing) + "\n")
    if "steps" in args.sections and HAS_TRL:
        case = arms.CASES[0]
        head = results[0] if results and "trl_seconds" in results[0] else None
        trl_pass = (
            head["trl_seconds"]
            if head
            else arms.trl_arm(case, paths["messages"], args.seq_len, args.batch_size)["seconds"]
        )
        first = (
            head["first"]
            if head
            else arms.first_batch(case, paths["messages"], args.seq_len, args.batch_size, args.pack_buffer, args.repeat)
        )
        steps = sft_packing.first_step_rows(
            paths["messages"],
            case.template,
            args.seq_len,
            args.batch_size,
            args.step_repeat,
            str(work),
            first,
            trl_pass,
        )
        print(table(["`llama3_marked`, messages", "TRL (s)", "padpipe (s)", "padpipe sooner"], steps) + "\n")
    if "rates" in args.sections:
        rate_rows = rates(paths["messages"], args.rate_conversations, args.rate_rounds)
        print(table(["tokenizing with labels", "conversations/s", "vs HF with masks"], rate_rows) + "\n")
    if "buffers" in args.sections:
        sweep = buffers(paths["messages"], args)
        print(table(["pack_buffer", "1st batch (s)", "packing eff.", "state after 20 batches"], sweep))
    if args.chart:
        chart(results, args.chart)
        print(f"\nchart: {args.chart}")


if __name__ == "__main__":
    main()
