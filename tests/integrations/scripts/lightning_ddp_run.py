"""Under torchrun x2: the Lightning DDP runs of this folder one after another in one launch (process start and the
lightning and transformers imports paid once, as tests/dist_scripts/workloads_run.py does for the runtime's).

Usage: ``torchrun --standalone --nproc_per_node=2 lightning_ddp_run.py DATA OUT``:

1. ``lightning_bare_run.py`` on a bare ``pipe.loader()`` with 0 and then 2 workers: writes
   ``OUT/bare<W>/rank<R>.json`` (its checkpoints in ``OUT/bare<W>/checkpoints``);
2. ``lightning_run.py`` on ``LightningLoader(pipe.loader(num_workers=2))``: writes ``OUT/loader/rank<R>.json``.

Each run builds its own modules and Trainers; tests/integrations/test_lightning_ddp.py checks them.
"""

from __future__ import annotations

import os
import sys

from tests.integrations.scripts import lightning_bare_run, lightning_run
from tests.integrations.tiny import finish


def main(data: str, out: str) -> None:
    for name in ("bare0", "bare2", "loader"):
        os.makedirs(f"{out}/{name}", exist_ok=True)
    for workers in (0, 2):
        lightning_bare_run.main(data, f"{out}/bare{workers}", workers)
    lightning_run.main(data, f"{out}/loader", 2)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    finish()
