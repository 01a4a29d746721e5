"""Train a jaxformer translation model: the `jaxformer-train` command, for a clone
(jaxformer/commands/train.py; run with --help).

    python train.py --config multi30k --workdir runs/m30k
"""

from jaxformer.commands.launch import run_as_script
from jaxformer.commands.launch import train as main

if __name__ == "__main__":
    run_as_script(main)
