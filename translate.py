"""Thin entry point: see jaxformer/commands/translate.py (`python translate.py --help`)."""

from jaxformer.commands.launch import run_as_script
from jaxformer.commands.launch import translate as main

if __name__ == "__main__":
    run_as_script(main)
