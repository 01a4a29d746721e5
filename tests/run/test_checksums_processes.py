"""Checksums of arrays spread over two processes (jax.distributed on localhost, CPU devices), as a
checkpoint of an fsdp or tensor-parallel run takes them: every process gets the same digests as
one process reading the whole arrays, and none waits for ever (the programs that sum them, each
with its collectives, were all in flight at once, and gloo's hosts took them in different orders)."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from jaxformer.run.checksums import array_checksums

SHAPES = [(64, 32), (32,), (16, 4, 8), (4, 8, 16), ()]
SPECS = ['P("fsdp")', "P()", 'P("fsdp", "tensor")', 'P(None, None, "fsdp")', "P()"]

PROGRAM = textwrap.dedent(
    """
    import faulthandler, json, sys
    faulthandler.dump_traceback_later(100, exit=True)  # a hang is a failure with the stack, not a stuck suite
    import jax
    jax.distributed.initialize(sys.argv[1], num_processes=2, process_id=int(sys.argv[2]))
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from jaxformer.run.checksums import array_checksums

    mesh = Mesh(np.array(jax.devices()).reshape(1, 2, 2), ("data", "fsdp", "tensor"))
    shapes, specs = {shapes}, [{specs}]
    rng = np.random.default_rng(0)
    tree = {{}}
    for index in range(60):
        host = rng.standard_normal(shapes[index % 5]).astype(np.float32)
        sharding = NamedSharding(mesh, specs[index % 5])
        tree[f"a{{index}}"] = jax.make_array_from_callback(host.shape, sharding, lambda where, h=host: h[where])
    print(json.dumps(array_checksums(tree)))
    """
)


def host_arrays():
    rng = np.random.default_rng(0)
    return {f"a{index}": rng.standard_normal(SHAPES[index % 5]).astype(np.float32) for index in range(60)}


@pytest.mark.xdist_group("distributed-processes")
def test_arrays_spread_over_processes_are_summed_alike_in_each(tmp_path):
    script = tmp_path / "sums.py"
    script.write_text(PROGRAM.format(shapes=SHAPES, specs=", ".join(SPECS)))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    processes = [
        subprocess.Popen(
            [sys.executable, str(script), address, str(index)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index in range(2)
    ]
    outputs = [process.communicate(timeout=240) for process in processes]
    for process, (_, error) in zip(processes, outputs):
        assert process.returncode == 0, error[-3000:]
    digests = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert digests[0] == digests[1] == array_checksums(host_arrays())
