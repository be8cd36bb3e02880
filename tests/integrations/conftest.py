"""Framework tests run their tiny models on one intra-op thread (the CI machine has 2 shared cores)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


collect_ignore = ["scripts"]  # torchrun entry points, imported by the tests that run them
