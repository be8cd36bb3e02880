"""Framework tests run their tiny models on one intra-op thread (the CI machine has 2 shared cores).

Module-scoped, so it also covers the module fixtures (an autouse fixture comes first in its scope): on two busy
cores, torch's second intra-op thread spins and costs ~10x the CPU of a tiny model's steps.
"""

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


collect_ignore = ["scripts"]  # torchrun entry points, imported by the tests that run them
