"""Thin entry point: see jaxformer/commands/average_checkpoints.py (`python average_checkpoints.py --help`)."""

from jaxformer.commands.launch import average_checkpoints as main
from jaxformer.commands.launch import run_as_script

if __name__ == "__main__":
    run_as_script(main)
