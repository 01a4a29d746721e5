"""Checksums of arrays spread over two processes (jax.distributed on localhost, CPU devices), as a
checkpoint of an fsdp or tensor-parallel run takes them: every process gets the same digests as
one process reading the whole arrays, and none waits for ever (the programs that sum them, each
with its collectives, were all in flight at once, and gloo's hosts took them in different orders)."""

import json
import textwrap

import numpy as np
import pytest

from jaxformer.run.checksums import array_checksums
from tests.run.two_processes import run_two_processes

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
    outputs = run_two_processes(script, devices=2)
    digests = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert digests[0] == digests[1] == array_checksums(host_arrays())
