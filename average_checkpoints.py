"""Thin entry point: see jaxformer/commands/average_checkpoints.py (`python average_checkpoints.py --help`)."""

import sys

from jaxformer.commands.launch import average_checkpoints as main

if __name__ == "__main__":
    sys.exit(main())
