"""Train a jaxformer translation model.

    python train.py --config configs/multi30k.py --workdir runs/m30k
    python train.py --config configs/multi30k.py --workdir runs/m30k --config.model.num_encoder_layers=4

Running the same command again resumes from the newest checkpoint in the workdir; SIGTERM
or Ctrl-C saves a checkpoint and stops.
"""

import logging as std_logging

from absl import app, flags, logging
from ml_collections import config_flags

from jaxformer.training.loop import train_and_evaluate

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/*.py).", lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for checkpoints, the tokenizer and metrics.")
flags.DEFINE_bool("distributed", False, "Join a multi-process run via jax.distributed (auto-detected on TPU pods, SLURM).")
flags.DEFINE_string("coordinator_address", None, "host:port of process 0, for a multi-process run launched by hand.")
flags.DEFINE_integer("num_processes", None, "Number of processes in a multi-process run launched by hand.")
flags.DEFINE_integer("process_id", None, "This process's index in a multi-process run launched by hand.")
flags.mark_flags_as_required(["config", "workdir"])


class _QuietLibraries(std_logging.Filter):
    """Drops orbax's and tfds's INFO chatter (a dozen lines per checkpoint); warnings pass."""

    def filter(self, record):
        noisy = "/orbax/" in record.pathname or "/tensorflow_datasets/" in record.pathname
        return record.levelno >= std_logging.WARNING or not noisy


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    logging.set_verbosity(logging.INFO)
    logging.get_absl_handler().addFilter(_QuietLibraries())
    if FLAGS.distributed or FLAGS.coordinator_address:
        import jax

        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU processes (GPU/TPU ignore it)
        jax.distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
        logging.info("process %d of %d", jax.process_index(), jax.process_count())
    train_and_evaluate(FLAGS.config, FLAGS.workdir)


if __name__ == "__main__":
    app.run(main)
