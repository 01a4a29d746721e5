"""Thin entry point: see jaxformer/commands/translate.py (`python translate.py --help`)."""

import sys

from jaxformer.commands.launch import translate as main

if __name__ == "__main__":
    sys.exit(main())
