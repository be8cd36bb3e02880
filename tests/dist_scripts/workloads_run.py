"""Run under ``torchrun``: several workloads of this folder in one process group (process start and imports paid once).

Usage: ``python -m torch.distributed.run --standalone --nproc_per_node=R workloads_run.py OUT TAG NAME=DATA ...``

Each ``NAME`` is a module here, ``NAME_run.py`` (``fillers``, ``long_docs``), whose ``result(DATA)`` reads
its workload on this rank and returns the rank's record. The workloads run one after another, with a
barrier after each, and every rank writes ``OUT/TAG-NAME-rank<R>.json``.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    out, tag, *todo = sys.argv[1:]
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    for item in todo:
        name, data = item.split("=", 1)
        record = importlib.import_module(f"{name}_run").result(data)  # this script's folder is sys.path[0]
        with open(os.path.join(out, f"{tag}-{name}-rank{rank}.json"), "w") as f:
            json.dump(record, f)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
