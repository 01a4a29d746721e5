"""Thin entry point: see jaxformer/commands/convert.py (`python convert.py --help`)."""

from jaxformer.commands.launch import convert as main
from jaxformer.commands.launch import run_as_script

if __name__ == "__main__":
    run_as_script(main)
