"""Thin entry point: see jaxformer/commands/export.py (`python export.py --help`)."""

from jaxformer.commands.launch import export as main
from jaxformer.commands.launch import run_as_script

if __name__ == "__main__":
    run_as_script(main)
