"""Average the parameters of the last N checkpoints of a run into `workdir/averaged`.

python average_checkpoints.py --workdir runs/m30k --last 5
python evaluate.py --workdir runs/m30k --checkpoint averaged --split test_2016_flickr
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

import jax
import numpy as np

from jaxformer.commands.common import at_least, check_workdir, make_parser, run_command
from jaxformer.errors import CheckpointError
from jaxformer.run.checkpoint import Checkpointer
from jaxformer.run.directory import RunDirectory
from jaxformer.run.loading import load_checkpoint


def average_parameters(trees: list[Any]) -> Any:
    """The element-wise mean of parameter trees of one structure, accumulated in float64."""
    if not trees:
        raise ValueError("nothing to average")
    structure = jax.tree.structure(trees[0])
    for index, tree in enumerate(trees[1:], start=1):
        if jax.tree.structure(tree) != structure:
            raise ValueError(f"parameter tree {index} differs in structure from tree 0")
    return jax.tree.map(
        lambda *leaves: (sum(np.asarray(leaf, np.float64) for leaf in leaves) / len(leaves)).astype(
            np.asarray(leaves[0]).dtype
        ),
        *trees,
    )


def average_last(workdir: str | os.PathLike, last: int) -> tuple[int, list[int]]:
    """Writes the mean of the last `last` checkpoints as `workdir/averaged/<newest step>`;
    returns (that step, the steps averaged)."""
    directory = RunDirectory(workdir)
    reader = Checkpointer(directory.checkpoints, keep=None)
    steps = reader.steps()
    reader.close()
    if len(steps) < last:
        raise CheckpointError(
            f"{workdir} has {len(steps)} checkpoints ({steps}); cannot average the last {last}. "
            "Raise training.keep_checkpoints to keep more."
        )
    chosen = steps[-last:]
    trees, metadata = [], None
    for step in chosen:
        _, metadata, params = load_checkpoint(workdir, step)
        trees.append(params)
        logging.info("read step %d", step)
    metadata = metadata.replace(step=chosen[-1], averaged_steps=tuple(chosen))
    writer = Checkpointer(directory.averaged, keep=1)
    writer.save_params(chosen[-1], average_parameters(trees), metadata)
    writer.close()
    return chosen[-1], chosen


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser(__doc__)
    parser.add_argument("--workdir", required=True, help="the training run's directory")
    parser.add_argument("--last", type=at_least(1), default=5, help="how many of the newest checkpoints (default: 5)")
    return parser


def run(args: argparse.Namespace) -> int:
    check_workdir(args.workdir)
    step, chosen = average_last(args.workdir, args.last)
    print(f"averaged steps {chosen} into {RunDirectory(args.workdir).averaged / str(step)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), run, argv, log_level=logging.INFO)


if __name__ == "__main__":
    sys.exit(main())
