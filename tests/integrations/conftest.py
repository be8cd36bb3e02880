"""Framework tests: their torchrun entry points are not collected. (Every test process runs one intra-op thread:
the root conftest.py sets ``OMP_NUM_THREADS=1``.)"""

collect_ignore = ["scripts"]  # torchrun entry points, imported by the tests that run them
