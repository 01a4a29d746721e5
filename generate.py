"""Thin entry point: see jaxformer/commands/generate.py (`python generate.py --help`)."""

from jaxformer.commands.launch import generate as main
from jaxformer.commands.launch import run_as_script

if __name__ == "__main__":
    run_as_script(main)
