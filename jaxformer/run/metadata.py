"""The metadata stored with every checkpoint: what is needed, besides the arrays, to resume
the run or to translate with it.

In the checkpoint it is a JSON object (the `metadata` item of each step directory):

    {"config": {...},              the experiment config (ml_collections ConfigDict.to_dict())
     "model": {...},               the model's TransformerConfig.to_dict()
     "tokenizer": "<base64>",      the sentencepiece model proto (the source side's, when separate)
     "target_tokenizer": "<base64>" | null,   the target side's model; null: one shared vocabulary
     "data_fingerprint": "..." | null,   what the training data was prepared from (data/sources.py)
     "step": 1000,
     "train_seconds": 1834.2,      seconds the training loop had spent at this step, across resumes
     "work_seconds": {"evaluate": 3.1, "bleu": 9.8, "checkpoint": 0.4},
                                   time-budgeted runs: the steady duration of each kind of periodic
                                   work (the median of the last three from a process's second of a
                                   kind on: its first holds the compilation), which the budget's end estimate
                                   counts (training/budget.py); "first_step": the latest segment's first step,
                                   its compilation included, which a resume with less budget left spends
                                   (training/budget_resume.py)
     "rdrop_by_pace": true,        runs whose R-Drop is decided by their pace, once decided: whether
                                   the steps after the decision use it (training/rdrop_start.py)
     "interim": true,              a checkpoint saved between scheduled ones to stop (a signal, unreadable data):
                                   the next checkpoint of the resumed run deletes it
     "train_window": {"steps": 4, "last_step": 34, "sums": {"loss_sum": 812.5, ...},
                      "learning_rate": 0.002, "seconds": 0.4},
                                   interim checkpoints saved between log steps only: the summed metrics
                                   of the steps since the last train/ record, which the resumed run
                                   goes on from (training/train_metrics.py)
     "saved_as_last": false,       training checkpoints since the mark was kept: whether the run saved it as its
                                   last, after that step's end-of-run work; a resume that ends at one saved
                                   otherwise does that work there (training/resumed_end.py; absent: older, inferred)
     "bleu": 27.3,                 best/ checkpoints only: the validation BLEU that made them best
     "averaged_steps": [800, 900, 1000],  averaged/ checkpoints only
     "chosen_from": "averaged",    final/ checkpoints only: which candidate the run chose
     "alpha": 1.0,                 final/ checkpoints only, when the choice searched with beams: its
                                   alpha, chosen on validation (training.final_alphas) or, compared
                                   with none, decoding.alpha (absent there in older final/ checkpoints)
     "started_from": "training.init_from: step 40 of /runs/a/checkpoints",
                                   a fine-tuned or composed run: the checkpoints it started from
     "started_from_params": {"training.init_from": "<32 hex digits>"},
                                   and the identity of their parameters (run/checksums.py params_digest)
     "checksums": {...}}           added and verified by run/checkpoint.py (run/checksums.py)

Checkpoints written before this schema (plain dicts, possibly without "data_fingerprint" or
"target_tokenizer": shared) read the same way; keys this version does not know are ignored.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from jaxformer.data.tokenizer import Tokenizer
from jaxformer.errors import CheckpointError
from jaxformer.model.config import TransformerConfig
from jaxformer.run.checksums import params_digest


@dataclasses.dataclass(frozen=True)
class CheckpointMetadata:
    """A checkpoint's metadata: `to_json()` for writing, `from_json()` (validated) for reading."""

    config: dict[str, Any]  # the experiment config, as ConfigDict.to_dict()
    model: dict[str, Any]  # TransformerConfig.to_dict()
    tokenizer: bytes  # the sentencepiece model proto (base64 in JSON); the source side's when separate
    data_fingerprint: str | None  # None for datasets without one, and in checkpoints from before fingerprints
    step: int
    bleu: float | None = None  # set in best/ checkpoints
    averaged_steps: tuple[int, ...] | None = None  # set in averaged/ checkpoints
    target_tokenizer: bytes | None = None  # the target side's model with separate vocabularies; None: shared
    chosen_from: str | None = None  # set in final/ checkpoints: "latest", "best", "averaged" or "ema"
    train_seconds: float | None = None  # the training loop's seconds at this step (None: from before it was kept)
    alpha: float | None = None  # final/ checkpoints only: the beam search's length penalty (None: greedy, or older)
    rdrop_by_pace: bool | None = None  # the run's pace decided R-Drop on or off (None: undecided, or no such rule)
    # final/ checkpoints only: every candidate's and length penalty's validation scores ("latest/bleu",
    # "alpha_1.4/chrf", ...), so a run started again after its choice reports them all (None: from before)
    choice_scores: dict[str, float] | None = None
    interim: bool = False  # saved between scheduled checkpoints to stop (signal, unreadable data); next deletes it
    train_window: dict[str, Any] | None = None  # interim ones: the metrics of the steps since the last train/ record
    work_seconds: dict[str, float] | None = None  # time-budgeted runs: each periodic work's steady seconds (median)
    saved_as_last: bool | None = None  # saved as its run's last, its step's end work done (None: from before the mark)
    # A fine-tuned run's start, as its first step read it ("training.init_from: step 40 of /runs/a/checkpoints"; None:
    # none, or from before it was kept): a sweep's runs of one start must have started from the same checkpoint.
    started_from: str | None = None
    # The identity of each start's parameters then ({"training.init_from": params_digest}): a start's path and step
    # hold another run's parameters once that run is trained again in its workdir. None, or a start missing: recorded
    # before the identity was, or a start saved without checksums; a sweep then compares the paths and steps alone.
    started_from_params: dict[str, str] | None = None
    # Read, never written: the identity of the parameters of the checkpoint this metadata was read from (its checksums'
    # params_digest; None: without checksums, or metadata made or changed here, which a save gives its own checksums).
    params_digest: str | None = dataclasses.field(default=None, compare=False)

    def replace(self, **changes: Any) -> CheckpointMetadata:
        """A copy with `changes`; no longer the metadata read from a checkpoint (params_digest None)."""
        return dataclasses.replace(self, **{"params_digest": None, **changes})

    def model_config(self) -> TransformerConfig:
        return TransformerConfig.from_dict(self.model)

    def load_tokenizer(self) -> Tokenizer:
        """The shared (or source) sentencepiece model (`TokenizerError` if the stored bytes are
        not a usable one)."""
        return Tokenizer(self.tokenizer)

    def load_target_tokenizer(self) -> Tokenizer:
        """The target side's sentencepiece model: the shared one when the vocabulary is shared."""
        return Tokenizer(self.tokenizer if self.target_tokenizer is None else self.target_tokenizer)

    def load_tokenizers(self) -> tuple[Tokenizer, Tokenizer]:
        """(source, target) sentencepiece models: one Tokenizer, parsed once, for a shared vocabulary."""
        source = self.load_tokenizer()
        return source, source if self.target_tokenizer is None else Tokenizer(self.target_tokenizer)

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored in the checkpoint (without its checksums)."""
        values: dict[str, Any] = {
            "config": self.config,
            "model": self.model,
            "tokenizer": base64.b64encode(self.tokenizer).decode("ascii"),
            "data_fingerprint": self.data_fingerprint,
            "step": int(self.step),
        }
        if self.bleu is not None:
            values["bleu"] = float(self.bleu)
        if self.averaged_steps is not None:
            values["averaged_steps"] = [int(step) for step in self.averaged_steps]
        if self.target_tokenizer is not None:
            values["target_tokenizer"] = base64.b64encode(self.target_tokenizer).decode("ascii")
        if self.train_seconds is not None:
            values["train_seconds"] = float(self.train_seconds)
        if self.chosen_from is not None:
            values["chosen_from"] = self.chosen_from
        if self.alpha is not None:
            values["alpha"] = float(self.alpha)
        if self.rdrop_by_pace is not None:
            values["rdrop_by_pace"] = bool(self.rdrop_by_pace)
        if self.choice_scores is not None:
            values["choice_scores"] = {key: float(value) for key, value in self.choice_scores.items()}
        if self.interim:
            values["interim"] = True
        if self.train_window is not None:
            values["train_window"] = self.train_window
        if self.work_seconds is not None:
            values["work_seconds"] = {name: float(seconds) for name, seconds in self.work_seconds.items()}
        if self.saved_as_last is not None:
            values["saved_as_last"] = bool(self.saved_as_last)
        if self.started_from is not None:
            values["started_from"] = self.started_from
        if self.started_from_params is not None:
            values["started_from_params"] = dict(self.started_from_params)
        return values

    @classmethod
    def from_json(cls, values: Any, where: str) -> CheckpointMetadata:
        """The metadata in the JSON object `values` read from `where` (a file, for messages);
        `CheckpointError` naming `where` and the key if a key is missing or has the wrong type."""
        if not isinstance(values, Mapping):
            raise CheckpointError(
                f"{where} holds a JSON {_json_type(values)}, not an object: not a jaxformer checkpoint's metadata"
            )

        def fail(key: str, problem: str) -> CheckpointError:
            return CheckpointError(f"{where}: key {key!r} {problem}; not a jaxformer checkpoint's metadata")

        missing = [key for key in ("config", "model", "tokenizer", "step") if key not in values]
        if missing:
            raise fail(missing[0], "is missing")

        def typed(key: str, kinds: tuple[type, ...], expected: str, optional: bool = False) -> Any:
            value = values.get(key)
            if value is None and optional:
                return None
            if not isinstance(value, kinds) or isinstance(value, bool):
                raise fail(key, f"holds a JSON {_json_type(value)}, not {expected}")
            return value

        def model_bytes(key: str, optional: bool = False) -> bytes | None:
            text = typed(key, (str,), "a base64 string", optional=optional)
            if text is None:
                return None
            try:
                return base64.b64decode(text.encode("ascii"), validate=True)
            except (binascii.Error, UnicodeEncodeError):
                raise fail(key, "is not valid base64") from None

        def optional_boolean(key: str) -> bool | None:
            value = values.get(key)
            if value is not None and not isinstance(value, bool):
                raise fail(key, f"holds a JSON {_json_type(value)}, not a boolean")
            return value

        tokenizer = model_bytes("tokenizer")
        averaged = typed("averaged_steps", (list,), "a list of steps", optional=True)
        if averaged is not None and not all(isinstance(s, int) and not isinstance(s, bool) for s in averaged):
            raise fail("averaged_steps", "holds something other than integer steps")
        bleu = typed("bleu", (int, float), "a number", optional=True)
        train_seconds = typed("train_seconds", (int, float), "a number", optional=True)
        alpha = typed("alpha", (int, float), "a number", optional=True)
        rdrop_by_pace = optional_boolean("rdrop_by_pace")
        interim = values.get("interim", False)
        if not isinstance(interim, bool):
            raise fail("interim", f"holds a JSON {_json_type(interim)}, not a boolean")
        choice_scores = typed("choice_scores", (Mapping,), "an object", optional=True)
        if choice_scores is not None and not all(
            isinstance(value, (int, float)) and not isinstance(value, bool) for value in choice_scores.values()
        ):
            raise fail("choice_scores", "holds something other than numbers")
        work_seconds = typed("work_seconds", (Mapping,), "an object", optional=True)
        if work_seconds is not None and not all(
            isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
            for value in work_seconds.values()
        ):
            raise fail("work_seconds", "holds something other than durations (finite numbers >= 0)")
        train_window = typed("train_window", (Mapping,), "an object", optional=True)
        if train_window is not None and not _is_train_window(train_window):
            raise fail(
                "train_window", "is not the metrics of a log interval (steps, last_step, sums, learning_rate, seconds)"
            )
        if alpha is not None and not (math.isfinite(alpha) and alpha >= 0):
            raise fail("alpha", f"is {alpha}, not a length penalty (a finite number >= 0)")
        started_from_params = typed("started_from_params", (Mapping,), "an object", optional=True)
        if started_from_params is not None and not all(
            isinstance(value, str) for value in started_from_params.values()
        ):
            raise fail("started_from_params", "holds something other than strings")
        return cls(
            config=dict(typed("config", (Mapping,), "an object")),
            model=dict(typed("model", (Mapping,), "an object")),
            tokenizer=tokenizer,
            data_fingerprint=typed("data_fingerprint", (str,), "a string", optional=True),
            step=typed("step", (int,), "an integer"),
            bleu=None if bleu is None else float(bleu),
            averaged_steps=None if averaged is None else tuple(averaged),
            target_tokenizer=model_bytes("target_tokenizer", optional=True),
            train_seconds=None if train_seconds is None else float(train_seconds),
            chosen_from=typed("chosen_from", (str,), "a string", optional=True),
            started_from=typed("started_from", (str,), "a string", optional=True),
            started_from_params=None if started_from_params is None else dict(started_from_params),
            params_digest=params_digest(values),
            alpha=None if alpha is None else float(alpha),
            rdrop_by_pace=rdrop_by_pace,
            choice_scores=None
            if choice_scores is None
            else {key: float(value) for key, value in choice_scores.items()},
            interim=interim,
            train_window=None if train_window is None else dict(train_window),
            work_seconds=None if work_seconds is None else {key: float(value) for key, value in work_seconds.items()},
            saved_as_last=optional_boolean("saved_as_last"),
        )


def _is_train_window(values: Mapping[str, Any]) -> bool:
    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    counts = [values.get(key) for key in ("steps", "last_step")]
    sums = values.get("sums")
    return (
        all(isinstance(count, int) and not isinstance(count, bool) and count > 0 for count in counts)
        and isinstance(sums, Mapping)
        and all(key in sums for key in ("loss_sum", "nll_sum", "correct", "weight", "grad_norm"))
        and all(number(value) for value in sums.values())
        and number(values.get("learning_rate"))
        and number(values.get("seconds"))
    )


def _json_type(value: Any) -> str:
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
