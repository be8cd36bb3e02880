"""Chat SFT on the real templates of 2026 beside TRL: what each refuses, what each trains, and at what cost.

For each template of ``tests/chat/real_templates.py`` (TRL 1.16's byte-identical originals, Mistral-v0.3,
Phi-4, SmolLM2), the same conversations (system messages, 1-3 exchanges, reasoning in half the answers, a
tool call where the template takes tools):

- padpipe: ``.chat(tok)`` at its defaults: conversations refused, rows made, answers' reasoning dropped by
  the template (counted), time per conversation.
- TRL: what ``SFTTrainer(assistant_only_loss=True)`` tokenizes with: the model's template if it has
  ``{% generation %}`` markers, else ``get_training_chat_template`` (TRL's patched copy, or a refusal);
  conversations it fails on, and how many of its rows are the model's own rendering
  (``apply_chat_template`` with the original template), time per conversation.
- As written: ``read_jsonl(...).chat(tok)``, which reads the conversation columns as JSON text, against
  ``read_parquet`` of the same conversations as Arrow structs (the path before: correct only when every
  row has the same keys, as here), end to end, conversations a second.

Run: ``python benchmarks/sft_templates.py`` (about a minute); ``--conversations N``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import padpipe as pp  # noqa: E402
from padpipe.chat.options import ChatOptions  # noqa: E402
from padpipe.chat.template import ChatTemplate  # noqa: E402
from padpipe.pipes.chat import ChatTokenizer  # noqa: E402
from tests.chat import real_templates as rt  # noqa: E402


def padpipe_arm(tok: Any, chats: list[list[dict[str, Any]]]) -> dict[str, Any]:
    fn = ChatTokenizer(ChatTemplate(tok), ChatOptions(on_error="skip"))
    batch = pa.RecordBatch.from_pylist([{"idx": i, "messages": json.dumps(c)} for i, c in enumerate(chats)])
    start = time.perf_counter()
    chunk = fn(batch)
    seconds = time.perf_counter() - start
    snap = fn.stats.snapshot()
    return {
        "refused": sum(snap.skipped.values()),
        "rows": chunk.num_rows,
        "dropped": {k[len("chat.dropped_") :]: v for k, v in snap.counters.items() if k.startswith("chat.dropped_")},
        "ms": 1000 * seconds / len(chats),
    }


def trl_arm(tok: Any, chats: list[list[dict[str, Any]]]) -> dict[str, Any]:
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    try:
        template = None if has_generation_markers(tok.chat_template) else get_training_chat_template(tok)
    except Exception as exc:  # TRL refuses the template
        return {"template": f"refused ({type(exc).__name__})", "failed": len(chats), "own": 0, "ms": float("nan")}
    failed = own = 0
    start = time.perf_counter()
    for chat in chats:
        try:
            out = tok.apply_chat_template(
                chat, chat_template=template, return_dict=True, return_assistant_tokens_mask=True, tokenize=True
            )
        except Exception:
            failed += 1
            continue
        own += list(out["input_ids"]) == rt.fx.reference(tok, chat)
    seconds = time.perf_counter() - start
    return {
        "template": "own (marked)" if template is None else "TRL's training copy",
        "failed": failed,
        "own": own,
        "ms": 1000 * seconds / len(chats),
    }


def as_written(n: int) -> list[str]:
    """read_jsonl + chat (JSON text) against read_parquet of struct columns + chat, conversations a second."""
    tok = rt.tokenizer("qwen2_5")
    chats = rt.fx.conversations(n, seed=5)
    rows = [{"id": i, "messages": chat} for i, chat in enumerate(chats)]
    with tempfile.TemporaryDirectory() as folder:
        jsonl, parquet = Path(folder, "c.jsonl"), Path(folder, "c.parquet")
        jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
        pq.write_table(pa.Table.from_pylist(rows), parquet)
        out = {}
        for name, pipe in (("parquet", pp.read_parquet(str(parquet))), ("jsonl", pp.read_jsonl(str(jsonl)))):
            best = float("inf")
            for _ in range(3):
                start = time.perf_counter()
                for _batch in pipe.chat(tok).batch(64).pad().loader():
                    pass
                best = min(best, time.perf_counter() - start)
            out[name] = n / best
    return [f"{out['parquet']:,.0f}", f"{out['jsonl']:,.0f}", f"{out['jsonl'] / out['parquet']:.2f}x"]


def table(header: Sequence[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=200, help="conversations per template (default 200)")
    parser.add_argument("--written", type=int, default=5000, help="conversations of the as-written arms")
    args = parser.parse_args(argv)
    rows = []
    for name in sorted(rt.MODELS):
        tok = rt.tokenizer(name)
        chats = rt.conversations(name, args.conversations, seed=11)
        mine, trl = padpipe_arm(tok, chats), trl_arm(tok, chats)
        dropped = ", ".join(f"{k} {v}" for k, v in sorted(mine["dropped"].items())) or "-"
        rows.append(
            [
                name,
                f"{mine['refused']}",
                f"{mine['rows']}",
                dropped,
                f"{mine['ms']:.2f}",
                trl["template"],
                f"{trl['failed']}",
                f"{trl['own']}",
                f"{trl['ms']:.2f}",
            ]
        )
    header = [
        "template",
        "padpipe refused",
        "padpipe rows",
        "not rendered (counted)",
        "padpipe ms/conv",
        "TRL tokenizes with",
        "TRL failed",
        "TRL rows = model's rendering",
        "TRL ms/conv",
    ]
    print(f"{args.conversations} conversations per template\n")
    print(table(header, rows))
    print(f"\nas written, {args.written} conversations, conversations a second (best of 3):\n")
    print(table(["read_parquet (Arrow structs)", "read_jsonl (JSON text)", "ratio"], [as_written(args.written)]))


if __name__ == "__main__":
    main()
