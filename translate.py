"""Thin entry point: see jaxformer/commands/translate.py (`python translate.py --help`)."""

import sys

from jaxformer.commands.translate import main

if __name__ == "__main__":
    sys.exit(main())
