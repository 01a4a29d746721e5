"""jaxformer used as a library logs through its modules' loggers (`logging.getLogger(__name__)`,
under "jaxformer"), so a host program quietens or routes them by that name, and jaxformer's own
calls never configure the host's logging (Python's module-level `logging.warning()` and friends
call `logging.basicConfig()` when the root logger has no handler)."""

import ast
import logging
import pathlib

from jaxformer.data.pipeline import TokenizePair, eval_batches
from jaxformer.data.tokenizer import train_tokenizer
from jaxformer.training.experiment import default_config

ROOT = pathlib.Path(__file__).resolve().parents[1]
ROOT_LOGGER_CALLS = {"debug", "info", "warning", "warn", "error", "exception", "critical", "log"}
# serve.py of an export: a script whose main() configures logging for itself.
SCRIPTS = {"jaxformer/export/standalone.py"}


def test_no_module_logs_through_the_root_logger_functions():
    offenders = []
    for path in sorted((ROOT / "jaxformer").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        if name in SCRIPTS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            function = node.func if isinstance(node, ast.Call) else None
            if (
                isinstance(function, ast.Attribute)
                and isinstance(function.value, ast.Name)
                and function.value.id == "logging"
                and function.attr in ROOT_LOGGER_CALLS
            ):
                offenders.append(f"{name}:{node.lineno} logging.{function.attr}")
    assert offenders == []


def test_a_host_program_controls_jaxformers_log_through_the_jaxformer_logger(caplog):
    records = [{"en": b"a b c d e f g h i j k l", "de": b"m n"}] + [{"en": b"a b", "de": b"c d"}] * 3
    tokenizer = train_tokenizer([r[k] for r in records for k in ("en", "de")] * 20, vocab_size=20)
    data = default_config().data
    data.update(dict(source_language="en", target_language="de", max_length=8, eval_batch_size=2))
    eval_batches(records, TokenizePair.for_data(data, tokenizer), data)
    (record,) = [r for r in caplog.records if "left out" in r.getMessage()]
    assert record.name == "jaxformer.data.pipeline"
    assert record.getMessage() == "validation: 1 of 4 examples longer than 8 tokens left out"
    caplog.clear()
    logging.getLogger("jaxformer").setLevel(logging.ERROR)  # what a host program does to quieten it
    try:
        eval_batches(records, TokenizePair.for_data(data, tokenizer), data)
    finally:
        logging.getLogger("jaxformer").setLevel(logging.NOTSET)
    assert not [r for r in caplog.records if "left out" in r.getMessage()]
