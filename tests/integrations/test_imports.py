"""The core never imports a training framework: only padpipe.hf and padpipe.integrations.* do."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.integrations.tiny import ROOT

FRAMEWORKS = ("transformers", "accelerate", "lightning", "pytorch_lightning")


def test_padpipe_imports_and_runs_without_importing_a_framework():
    code = (
        "import sys\n"
        "import padpipe as pp\n"
        "from torch.utils.data import DataLoader\n"
        "pipe = pp.from_iterable([{'text': 'a b c'}, {'text': 'd'}]).tokenize(pp.examples.tokenizer()).batch(2).pad()\n"
        "assert len(list(pipe.loader())) == len(list(DataLoader(pipe, batch_size=None))) == 1\n"
        f"print(sorted(name for name in {FRAMEWORKS!r} if name in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"
