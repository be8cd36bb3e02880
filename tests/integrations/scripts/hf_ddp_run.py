"""Under torchrun x2: the ``padpipe.hf.Trainer`` runs of this folder one after another in one launch (process start
and the transformers import paid once, as tests/dist_scripts/workloads_run.py does for the runtime's workloads).

Usage: ``torchrun --standalone --nproc_per_node=2 hf_ddp_run.py DATA FILLER_DATA OUT``:

1. ``hf_trainer_run.py`` on DATA with ``dataloader_num_workers=2``: writes ``OUT/trainer/rank<R>.json``;
2. ``hf_epochs_run.py`` on DATA: writes ``OUT/epochs/rank<R>.json``;
3. ``hf_filler_run.py`` on FILLER_DATA (one training row): writes ``OUT/filler/rank<R>.json``.

Each run builds its own models, Trainers and output folders; tests/integrations/test_hf_trainer.py checks them.
"""

from __future__ import annotations

import os
import sys

from tests.integrations.scripts import hf_epochs_run, hf_filler_run, hf_trainer_run
from tests.integrations.tiny import finish


def main(data: str, filler_data: str, out: str) -> None:
    for name in ("trainer", "epochs", "filler"):
        os.makedirs(f"{out}/{name}", exist_ok=True)
    hf_trainer_run.main(data, f"{out}/trainer", 2)
    hf_epochs_run.main(data, f"{out}/epochs")
    hf_filler_run.main(filler_data, f"{out}/filler")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
    finish()
