"""Thin entry point: see jaxformer/commands/sweep.py (`python sweep.py --help`)."""

from jaxformer.commands.launch import run_as_script
from jaxformer.commands.launch import sweep as main

if __name__ == "__main__":
    run_as_script(main)
