"""Thin entry point: see jaxformer/commands/evaluate.py (`python evaluate.py --help`)."""

import sys

from jaxformer.commands.launch import evaluate as main

if __name__ == "__main__":
    sys.exit(main())
