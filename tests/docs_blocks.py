"""Find the code blocks of a Markdown page and run them as a reader would (used by ``tests/test_docs.py``).

What runs, and how a page's author controls it:

* A ```` ```python ```` block runs on its own, with fresh names (as if pasted into a new
  interpreter), in an empty temporary folder, offline (``HF_HUB_OFFLINE=1``).
* A ```` ```text ```` block (or a bare ```` ``` ```` one) that follows a python block with nothing but
  blank lines between is that block's output: the block must print exactly that (trailing spaces aside). Put a sentence
  between them to show text that is not checked (timings, say).
* A ```` ```bash ```` block runs line by line (a line ending in ``\\`` continues) with ``bash``,
  from a folder that links to the repository's top-level entries (so commands say
  ``padpipe/data/...`` as a reader in a clone would, and files they write land elsewhere);
  every command must succeed.
* A ```` ```console ```` block holds ``$ command`` lines, each followed by its output, which must
  be exactly what the command prints (standard output and error together; its exit code is not
  checked, so an error example may show the error).
* A block preceded by ``<!-- no-run: why -->`` (the reason is required) is not run: only for what
  truly cannot run on a CPU machine in the test (needs a GPU, installs packages, the network).
* A block preceded by ``<!-- needs: module -->`` runs where ``module`` imports, and is skipped (with
  that reason) where it does not: for an optional package that a development set-up may lack
  (torchtitan, which ``make setup`` installs).
* A python block preceded by ``<!-- continues -->`` goes on from the python block before it on
  the page (its names and folder), for a page that builds one example step by step.

Commands use the interpreter running the tests as ``python`` and import padpipe from the
repository; a plain ``python -m module args`` runs in the page's own interpreter (as
``runpy`` does it: same code, without starting a new one), anything else in ``bash``. ``python -m tests.docs_blocks PAGE.md [PAGE.md ...] REPORT.json`` runs pages, one after another in
one interpreter (each block still with fresh names), and writes a JSON report (one result per block).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCK_TIMEOUT = 180
"""Seconds one block may run."""
RUN_KINDS = ("python", "bash", "console")
FENCE = re.compile(r"^```([\w+-]*)\s*$")
NO_RUN = re.compile(r"^<!--\s*no-run:\s*(\S.*?)\s*-->$")
NEEDS = re.compile(r"^<!--\s*needs:\s*([\w.]+)\s*-->$")
CONTINUES = "<!-- continues -->"


@dataclass
class Block:
    """One fenced block: where it starts (1-based line of its fence), its language and text."""

    page: str
    line: int
    kind: str
    code: str
    output: str | None = None
    no_run: str | None = None
    continues: bool = False
    needs: str | None = None

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


@dataclass
class Result:
    """How a block went: ``ok``, or the error or the output that differed."""

    name: str
    ok: bool
    seconds: float
    message: str = ""
    skipped: str = ""


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown page (see :func:`parse`)."""
    return parse(path.read_text(encoding="utf-8"), _name(path))


def parse(markdown: str, page: str) -> list[Block]:
    """The fenced blocks of Markdown text, each text block right after a python block taken as its output.

    Example:
        >>> found = parse("<!-- no-run: needs a GPU -->\\n```python\\nx.to_cuda()\\n```\\n", "page.md")
        >>> [(b.name, b.kind, b.code, b.no_run) for b in found]
        [('page.md:2', 'python', 'x.to_cuda()\\n', 'needs a GPU')]
    """
    lines = markdown.splitlines()
    found: list[Block] = []
    i, previous = 0, ""
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            if lines[i].strip():
                previous = lines[i].strip()
            i += 1
            continue
        start, kind = i, fence.group(1)
        i += 1
        body = []
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        i += 1
        text = "".join(line + "\n" for line in body)
        if kind in ("text", "") and found and found[-1].kind == "python" and found[-1].output is None and not previous:
            found[-1].output = text
        else:
            skip, needs = NO_RUN.match(previous), NEEDS.match(previous)
            no_run, module = skip.group(1) if skip else None, needs.group(1) if needs else None
            found.append(
                Block(page, start + 1, kind, text, no_run=no_run, continues=previous == CONTINUES, needs=module)
            )
        previous = ""
    return found


def runnable(path: Path) -> list[Block]:
    """The blocks of ``path`` that the docs test runs (python, bash, console; not marked no-run)."""
    return [b for b in blocks(path) if b.kind in RUN_KINDS and b.no_run is None]


def run_page(path: Path) -> list[Result]:
    """Run every runnable block of a page, in order, each on its own (or on from the one above)."""
    results = []
    with contextlib.ExitStack() as python_context:
        context: tuple[dict, str] | None = None  # the names and folder of the last python block
        for block in runnable(path):
            if block.needs is not None and not _imports(block.needs):
                results.append(
                    Result(block.name, True, 0.0, skipped=f"needs {block.needs}, which does not import here")
                )
                continue
            fresh = block.kind == "python" and not (block.continues and context is not None)
            if fresh:  # the names of the block above go first, so that the collection below takes what they held
                python_context.close()
                context = None
            _collect()
            start = time.perf_counter()
            if fresh:
                folder = python_context.enter_context(tempfile.TemporaryDirectory(prefix="padpipe-docs-"))
                context = ({"__name__": "__main__"}, folder)
            try:
                message = run_python(block, *context) if block.kind == "python" else RUNNERS[block.kind](block)
            except Exception:  # the block failed: report its traceback, run the next one
                message = traceback.format_exc()
            results.append(Result(block.name, not message, round(time.perf_counter() - start, 2), message))
    return results


FREEZE = False  # set by the page runner (``python -m tests.docs_blocks``), never in a pytest process


def _collect() -> None:
    """Collect what earlier blocks left (now, not while the next one prints); in the page runner, freeze what is left.

    What survives is the frameworks' modules and caches; frozen, later collections skip it (each full
    one took 0.2 s with Lightning and transformers imported, some 60 times a run). A pytest process
    calling these functions is not frozen: its later tests' garbage must still be collected.
    """
    gc.collect()
    if FREEZE:
        gc.freeze()


def _imports(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def run_python(block: Block, names: dict | None = None, folder: str | None = None) -> str:
    """Run a python block (default: fresh names, an empty folder); ``""`` when it printed its output."""
    out = io.StringIO()
    with contextlib.ExitStack() as stack:
        folder = folder or stack.enter_context(tempfile.TemporaryDirectory(prefix="padpipe-docs-"))
        with _cwd(folder), _alarm(BLOCK_TIMEOUT), contextlib.redirect_stdout(out):
            code = compile(block.code, block.name, "exec")
            exec(code, names if names is not None else {"__name__": "__main__"})  # noqa: S102 - the docs' own code
    return "" if block.output is None else _compare(block.output, out.getvalue())


def run_bash(block: Block) -> str:
    """Run each command of a bash block; ``""`` when all succeeded."""
    with _linked_checkout() as folder:
        for command in _commands(block.code.splitlines()):
            done = _shell(command, folder)
            if done.returncode != 0:
                return f"`{command}` exited with {done.returncode}:\n{done.stdout}"
    return ""


def run_console(block: Block) -> str:
    """Run each ``$ command`` of a console block and compare what it printed with the block."""
    steps: list[tuple[list[str], list[str]]] = []
    for line in block.code.splitlines():
        if line.startswith("$ "):
            steps.append(([line[2:]], []))
        elif steps and steps[-1][0][-1].endswith("\\") and not steps[-1][1]:
            steps[-1][0].append(line)
        elif steps:
            steps[-1][1].append(line)
    problems = []
    with _linked_checkout() as folder:
        for command_lines, expected in steps:
            command = "\n".join(command_lines)
            _collect()
            printed = _shell(command, folder).stdout
            difference = _compare("".join(e + "\n" for e in expected), printed)
            if difference:
                problems.append(f"$ {command}\n{difference}")
    return "\n".join(problems)


RUNNERS = {"python": run_python, "bash": run_bash, "console": run_console}


def _name(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return path.name


def _compare(expected: str, printed: str) -> str:
    want = [line.rstrip() for line in expected.rstrip().splitlines()]
    got = [line.rstrip() for line in printed.rstrip().splitlines()]
    if want == got:
        return ""
    import difflib

    diff = "\n".join(difflib.unified_diff(want, got, "the page shows", "the block printed", lineterm=""))
    return f"output differs:\n{diff}"


def _commands(lines: list[str]) -> list[str]:
    commands: list[str] = []
    pending = ""
    for line in lines:
        pending = f"{pending}\n{line}" if pending else line
        if line.endswith("\\"):
            continue
        if pending.strip() and not pending.lstrip().startswith("#"):
            commands.append(pending)
        pending = ""
    return commands


def _shell(command: str, folder: str) -> subprocess.CompletedProcess:
    """Run ``command`` from ``folder``: ``python -m module args`` in this interpreter, anything else in bash."""
    module = _python_module(command)
    if module is not None:
        return _run_module(*module, folder)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(
        ["bash", "-c", command],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=BLOCK_TIMEOUT,
        check=False,
    )


def _python_module(command: str) -> tuple[str, list[str]] | None:
    """``(module, args)`` of a plain ``python -m module args`` command (no pipes, redirects, ``&&``)."""
    import shlex

    try:
        words = shlex.split(command.replace("\\\n", " "))
    except ValueError:
        return None
    if len(words) < 3 or words[:2] != ["python", "-m"] or any(w in ("|", "&&", ";", ">", "<") for w in words):
        return None
    return words[2], words[3:]


def _run_module(module: str, args: list[str], folder: str) -> subprocess.CompletedProcess:
    """``python -m module args`` run here (no new interpreter: fast), printing into one captured stream."""
    import runpy

    printed = io.StringIO()
    code = 0
    argv = sys.argv
    sys.argv = [module, *args]
    sys.modules.pop(module, None)  # as in a new interpreter, where an earlier block has not imported it
    try:
        with (
            _cwd(folder),
            _alarm(BLOCK_TIMEOUT),
            contextlib.redirect_stdout(printed),
            contextlib.redirect_stderr(printed),
        ):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if not isinstance(exit_.code, (int, type(None))):
            printed.write(f"{exit_.code}\n")
    finally:
        sys.argv = argv
    return subprocess.CompletedProcess([module, *args], code, printed.getvalue())


@contextlib.contextmanager
def _linked_checkout():
    """A temporary folder linking to every top-level entry of the repository (but ``.git``/``.venv``)."""
    with tempfile.TemporaryDirectory(prefix="padpipe-docs-") as folder:
        for entry in ROOT.iterdir():
            if entry.name not in (".git", ".venv"):
                os.symlink(entry, os.path.join(folder, entry.name))
        yield folder


@contextlib.contextmanager
def _cwd(folder: str):
    old = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(old)


@contextlib.contextmanager
def _alarm(seconds: int):
    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"the block ran longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


if __name__ == "__main__":
    os.environ["HF_HUB_OFFLINE"] = "1"  # before anything imports huggingface_hub
    FREEZE = True
    *pages, target = sys.argv[1:]
    report = [asdict(r) for page in pages for r in run_page(Path(page))]
    Path(target).write_text(json.dumps(report), encoding="utf-8")
