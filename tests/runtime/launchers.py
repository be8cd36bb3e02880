"""Start ``torchrun`` launchers from a test and wait for them all, killing every process group on a timeout.

A launch is one or more launchers (one per simulated node) started at once, each in its own
session so that a hang is ended by killing its whole process group (launcher, ranks, DataLoader
workers). Output goes to files (no pipe can fill up and stall a rank) and is quoted when a
launcher fails or the launch runs past its time.

Example:
    >>> torchrun_command("run.py", "a", nproc=2, nnodes=2, node_rank=1, endpoint="127.0.0.1:29400")[3:8]
    ['--nnodes=2', '--node_rank=1', '--nproc_per_node=2', '--rdzv_backend=c10d', '--rdzv_endpoint=127.0.0.1:29400']
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "GLOO_SOCKET_IFNAME": "lo"}  # loopback only


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_command(
    script: str | Path, *args: str, nproc: int, nnodes: int = 1, node_rank: int = 0, endpoint: str | None = None
) -> list[str]:
    """The ``torch.distributed.run`` command of one launcher: ``--standalone``, or node ``node_rank`` of ``nnodes``.

    Several nodes meet through a c10d rendezvous at ``endpoint`` (``127.0.0.1:<port>``), each
    launcher giving ``127.0.0.1`` as its own address, so all traffic stays on the loopback.
    """
    if nnodes == 1 and endpoint is None:
        where = ["--standalone", f"--nproc_per_node={nproc}"]
    else:
        where = [
            f"--nnodes={nnodes}",
            f"--node_rank={node_rank}",
            f"--nproc_per_node={nproc}",
            "--rdzv_backend=c10d",
            f"--rdzv_endpoint={endpoint}",
            "--local_addr=127.0.0.1",
        ]
    return [sys.executable, "-m", "torch.distributed.run", *where, str(script), *args]


def run_launchers(commands: list[list[str]], *, timeout: float, what: str) -> None:
    """Run the launchers ``commands`` at once; fail the test (quoting their output) unless all exit 0 in time."""
    env = {**os.environ, **ENV}
    with tempfile.TemporaryDirectory(prefix="padpipe-launch-") as logs:
        outs = [open(Path(logs) / f"node{i}.log", "w+") for i in range(len(commands))]  # noqa: SIM115
        procs = [
            subprocess.Popen(c, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            for c, out in zip(commands, outs)
        ]
        deadline = time.monotonic() + timeout
        try:
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                if any(p.returncode not in (None, 0) for p in procs):
                    break  # one launcher failed: the others would wait for it at the rendezvous
                time.sleep(0.2)
        finally:
            running = [p for p in procs if p.poll() is None]
            for p in procs:  # every process group, also of a launcher that exited: nothing it started outlives it
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
            for p in procs:
                p.wait()
            texts = []
            for i, out in enumerate(outs):
                out.seek(0)
                texts.append(f"--- node {i} (exit {procs[i].returncode}):\n{out.read()[-4000:]}")
                out.close()
        output = "\n".join(texts)
        if running and time.monotonic() >= deadline:
            pytest.fail(f"torchrun {what} did not finish in {timeout:.0f} s (a hang?):\n{output}")
        if any(p.returncode != 0 for p in procs):
            pytest.fail(f"torchrun {what} failed:\n{output}")
