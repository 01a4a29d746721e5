"""A script run as both processes of a jax.distributed job on localhost (CPU devices): its
arguments are the coordinator's address, its process index, then the caller's."""

import os
import socket
import subprocess
import sys

from tests.xla_flags import xla_flags


def run_two_processes(script, *arguments: str, devices: int = 1) -> list[tuple[str, str]]:
    """(stdout, stderr) of each process, once both have exited 0 (an assertion error with the
    stderr's end of one that did not)."""
    processes = start_two_processes(script, *arguments, devices=devices)
    outputs = [process.communicate(timeout=240) for process in processes]
    for process, (_, error) in zip(processes, outputs):
        assert process.returncode == 0, error[-3000:]
    return outputs


def start_two_processes(script, *arguments: str, devices: int = 1) -> list[subprocess.Popen]:
    """Both processes, started, their stdout and stderr piped as text."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, XLA_FLAGS=xla_flags(devices), JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    return [
        subprocess.Popen(
            [sys.executable, str(script), address, str(index), *arguments],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index in range(2)
    ]
