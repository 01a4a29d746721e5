"""Train a jaxformer translation model (the `jaxformer-train` command; see
jaxformer/commands/train.py, or run with --help).

    python train.py --config configs/multi30k.py --workdir runs/m30k
"""

import sys

from jaxformer.commands.train import main

if __name__ == "__main__":
    sys.exit(main())
