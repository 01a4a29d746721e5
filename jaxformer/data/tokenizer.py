"""A joint source/target sentencepiece model with jaxformer's fixed special-token ids."""

from __future__ import annotations

import io
import logging
import pathlib
from collections.abc import Iterable, Sequence

import numpy as np
import sentencepiece as spm

from jaxformer.errors import UserError
from jaxformer.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID


class TokenizerError(UserError, ValueError):
    """Bytes or a file that are not a usable sentencepiece model; the message names the file."""


class Tokenizer:
    """Wraps a sentencepiece model: text <-> int32 ids (pad 0, eos 1, unk 2, bos 3)."""

    def __init__(self, model_proto: bytes):
        self.model_proto = bytes(model_proto)
        if not self.model_proto:
            raise TokenizerError("the sentencepiece model is empty")
        try:
            self._processor = spm.SentencePieceProcessor(model_proto=self.model_proto)
        except RuntimeError as error:  # sentencepiece's only report of a model it cannot parse
            raise TokenizerError(
                "not a sentencepiece model, or a damaged one: "
                f"sentencepiece cannot parse its {len(self.model_proto)} bytes"
            ) from error
        ids = (self._processor.pad_id(), self._processor.eos_id(), self._processor.unk_id(), self._processor.bos_id())
        if ids != (PAD_ID, EOS_ID, UNK_ID, BOS_ID):
            raise TokenizerError(
                f"sentencepiece model has (pad, eos, unk, bos) ids {ids}; jaxformer needs "
                f"{(PAD_ID, EOS_ID, UNK_ID, BOS_ID)} (train it with jaxformer.data.tokenizer.train_tokenizer)"
            )

    @classmethod
    def load(cls, path: str | pathlib.Path) -> Tokenizer:
        """The model in file `path`; `TokenizerError` naming the file if it cannot be read or used."""
        path = pathlib.Path(path)
        try:
            data = path.read_bytes()
        except OSError as error:
            raise TokenizerError(f"cannot read the tokenizer {path}: {error.strerror or error}") from error
        try:
            return cls(data)
        except TokenizerError as error:
            raise TokenizerError(f"the tokenizer {path} is unusable: {error}") from error

    def save(self, path: str | pathlib.Path) -> None:
        path = pathlib.Path(path)
        temporary = path.with_suffix(".tmp")
        temporary.write_bytes(self.model_proto)
        temporary.replace(path)  # atomic: a crash never leaves half a model

    @property
    def vocab_size(self) -> int:
        return self._processor.get_piece_size()

    def encode(self, text: str | Sequence[str], add_eos: bool = True) -> np.ndarray | list[np.ndarray]:
        """int32 ids of one string, or of each string in a list; EOS appended by default."""
        single = isinstance(text, str)
        encoded = self._processor.encode([text] if single else list(text), add_eos=add_eos)
        arrays = [np.asarray(ids, dtype=np.int32) for ids in encoded]
        return arrays[0] if single else arrays

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text of the ids up to the first EOS; padding and BOS are ignored."""
        ids = [int(i) for i in np.asarray(ids).reshape(-1)]
        if EOS_ID in ids:
            ids = ids[: ids.index(EOS_ID)]
        return self._processor.decode([i for i in ids if i not in (PAD_ID, BOS_ID)])

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """The subword strings of `ids` (for plots and debugging)."""
        return [self._processor.id_to_piece(int(i)) for i in ids]


def train_tokenizer(
    sentences: Iterable[str],
    vocab_size: int,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    max_sentences: int = 2_000_000,
    seed: int = 0,
) -> Tokenizer:
    """Trains one sentencepiece model on `sentences` (source and target text together).

    Beyond `max_sentences`, a sample drawn with `seed` is used, so the same corpus always
    gives the same model (sentencepiece's own sampling is not seeded).
    """
    if model_type not in ("unigram", "bpe"):
        raise ValueError(f"tokenizer.model_type={model_type!r}: choose 'unigram' or 'bpe'")
    sentences = list(sentences)
    if len(sentences) > max_sentences:
        chosen = np.sort(np.random.default_rng(seed).choice(len(sentences), max_sentences, replace=False))
        sentences = [sentences[i] for i in chosen]
    model = io.BytesIO()
    logging.info("training a %s sentencepiece model with %d pieces", model_type, vocab_size)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        shuffle_input_sentence=False,
        pad_id=PAD_ID,
        eos_id=EOS_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        pad_piece="<pad>",
        eos_piece="</s>",
        unk_piece="<unk>",
        bos_piece="<s>",
        num_threads=2,
        minloglevel=2,
    )
    return Tokenizer(model.getvalue())
