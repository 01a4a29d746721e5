"""Thin entry point: see jaxformer/commands/evaluate.py (`python evaluate.py --help`)."""

from jaxformer.commands.launch import evaluate as main
from jaxformer.commands.launch import run_as_script

if __name__ == "__main__":
    run_as_script(main)
