"""Sentencepiece models with jaxformer's fixed special-token ids: trained here (one joint
source/target model, or one per side), or converted from a model trained elsewhere."""

from __future__ import annotations

import functools
import io
import logging
import pathlib
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import sentencepiece as spm
from google.protobuf.message import DecodeError

from jaxformer.data.sentencepiece_proto import model_pb2
from jaxformer.errors import UserError
from jaxformer.files import write_bytes_atomically
from jaxformer.tokens import BOS_ID, EOS_ID, MASK_PIECE, NUM_SPECIAL_TOKENS, PAD_ID, UNK_ID

logger = logging.getLogger(__name__)


# What sentencepiece writes for the space before a word (escape_whitespaces): "A dog" is "▁A", "▁dog".
WORD_BOUNDARY = "\u2581"


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
                f"{(PAD_ID, EOS_ID, UNK_ID, BOS_ID)} (train it with jaxformer.data.tokenizer.train_tokenizer, "
                "or convert it with Tokenizer.from_sentencepiece_file)"
            )

    @classmethod
    def load(cls, path: str | pathlib.Path) -> Tokenizer:
        """The model in file `path`; `TokenizerError` naming the file if it cannot be read or used."""
        return cls._from_file(path, "tokenizer", lambda proto: proto)

    @classmethod
    def from_sentencepiece_file(cls, path: str | pathlib.Path, control_symbols: Sequence[str] = ()) -> Tokenizer:
        """A sentencepiece model trained elsewhere (any special ids, e.g. sentencepiece's default
        unk 0, bos 1, eos 2 and no pad), converted by `with_jaxformer_ids`, with the
        `control_symbols` it lacks (MASK_PIECE for a masked LM) added by `with_control_piece`;
        `TokenizerError` naming the file if it cannot be read or is not a sentencepiece model."""

        def convert(proto: bytes) -> bytes:
            proto = with_jaxformer_ids(proto)
            for piece in control_symbols:
                proto = with_control_piece(proto, piece)
            return proto

        return cls._from_file(path, "sentencepiece model", convert)

    @classmethod
    def _from_file(cls, path: str | pathlib.Path, what: str, convert: Callable[[bytes], bytes]) -> Tokenizer:
        path = pathlib.Path(path)
        try:
            data = path.read_bytes()
        except OSError as error:
            raise TokenizerError(f"cannot read the {what} {path}: {error.strerror or error}") from error
        try:
            return cls(convert(data))
        except TokenizerError as error:
            raise TokenizerError(f"the {what} {path} is unusable: {error}") from error

    def save(self, path: str | pathlib.Path) -> None:
        write_bytes_atomically(path, self.model_proto)  # a crash never leaves half a model

    @property
    def vocab_size(self) -> int:
        return self._processor.get_piece_size()

    def encode(self, text: str | Sequence[str], add_eos: bool = True) -> np.ndarray | list[np.ndarray]:
        """int32 ids of one string, or of each string in a list; EOS appended by default."""
        single = isinstance(text, str)
        encoded = self._processor.encode([text] if single else list(text), add_eos=add_eos)
        arrays = [np.asarray(ids, dtype=np.int32) for ids in encoded]
        return arrays[0] if single else arrays

    def nbest_encode(self, text: str, nbest_size: int) -> list[np.ndarray]:
        """int32 ids of `text`'s `nbest_size` most likely segmentations (fewer if it has fewer),
        most likely first, without EOS; unigram models only (`model_type`)."""
        return [
            np.asarray(ids, dtype=np.int32) for ids in self._processor.nbest_encode_as_ids(text, nbest_size=nbest_size)
        ]

    @functools.cached_property
    def piece_log_probabilities(self) -> np.ndarray:
        """float64 [vocab_size]: each piece's score, a unigram model's log probability of the piece
        (0 for special pieces)."""
        return np.array([self._processor.get_score(i) for i in range(self.vocab_size)], dtype=np.float64)

    @property
    def model_type(self) -> str:
        """The sentencepiece algorithm the model was trained with: "unigram", "bpe", "word" or "char"."""
        model = model_pb2.ModelProto()
        model.ParseFromString(self.model_proto)
        return model_pb2.TrainerSpec.ModelType.Name(model.trainer_spec.model_type).lower()

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text of the ids up to the first EOS; padding and BOS are ignored."""
        ids = [int(i) for i in np.asarray(ids).reshape(-1)]
        if EOS_ID in ids:
            ids = ids[: ids.index(EOS_ID)]
        return self._processor.decode([i for i in ids if i not in (PAD_ID, BOS_ID)])

    @property
    def mask_id(self) -> int | None:
        """The id of the masked-LM's MASK_PIECE, None when the vocabulary has none."""
        mask_id = self._processor.piece_to_id(MASK_PIECE)
        return mask_id if self._processor.is_control(mask_id) and mask_id != self._processor.unk_id() else None

    @functools.cached_property
    def word_starts(self) -> np.ndarray | None:
        """bool [vocab_size]: the pieces that begin a word, those whose text starts with
        sentencepiece's word-boundary mark WORD_BOUNDARY, the mark alone included (special pieces
        and <unk> do not). None for a model that marks where words end instead
        (treat_whitespace_as_suffix) or leaves spaces unmarked (escape_whitespaces off)."""
        model = model_pb2.ModelProto()
        model.ParseFromString(self.model_proto)
        if model.trainer_spec.treat_whitespace_as_suffix or not model.normalizer_spec.escape_whitespaces:
            return None
        return np.array([piece.startswith(WORD_BOUNDARY) for piece in self.pieces(range(self.vocab_size))])

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """The subword strings of `ids` (for plots and debugging)."""
        return [self._processor.id_to_piece(int(i)) for i in ids]


# (role, jaxformer's id, the trainer_spec fields naming the piece and its id), in id order.
_SPECIAL_ROLES = (
    ("pad", PAD_ID, "pad_piece", "pad_id"),
    ("eos", EOS_ID, "eos_piece", "eos_id"),
    ("unk", UNK_ID, "unk_piece", "unk_id"),
    ("bos", BOS_ID, "bos_piece", "bos_id"),
)


def with_jaxformer_ids(model_proto: bytes) -> bytes:
    """The same sentencepiece model with its special pieces at jaxformer's ids: <pad>, </s>,
    <unk>, <s> at 0, 1, 2, 3 (the pad, eos and bos pieces added as control symbols where the
    model lacks them), every other piece after them in its original order with its score and
    type. Segmentation depends on pieces and scores only, so text splits into the same pieces;
    only their ids change. A model that already has jaxformer's ids comes back unchanged."""
    model = model_pb2.ModelProto()
    try:
        model.ParseFromString(bytes(model_proto))
    except DecodeError as error:
        raise TokenizerError(
            f"not a sentencepiece model ({len(model_proto)} bytes that protobuf cannot parse)"
        ) from error
    if not model.pieces:
        raise TokenizerError(f"not a sentencepiece model ({len(model_proto)} bytes holding no pieces)")
    names = [piece.piece for piece in model.pieces]
    unknown = [piece.piece for piece in model.pieces if piece.type == model_pb2.ModelProto.SentencePiece.UNKNOWN]
    if len(unknown) != 1:
        raise TokenizerError(f"the sentencepiece model has {len(unknown)} unknown-piece entries, not 1")
    spec = model.trainer_spec
    spec.unk_piece = unknown[0]  # sentencepiece's own unk is whichever piece has the UNKNOWN type
    special = {}
    for role, _, piece_field, id_field in _SPECIAL_ROLES:
        name = getattr(spec, piece_field)
        if name in names:
            piece = model.pieces[names.index(name)]
            needed = "UNKNOWN" if role == "unk" else "CONTROL"  # what sentencepiece reports as the role's id
            found = model_pb2.ModelProto.SentencePiece.Type.Name(piece.type)
            if found != needed and getattr(spec, id_field) < 0:  # no such role: the name is only an ordinary piece's
                without = f" or without {name!r} in user_defined_symbols" if found == "USER_DEFINED" else ""
                raise TokenizerError(
                    f"the sentencepiece model has no {role} id ({id_field}=-1) and uses {name!r} as an ordinary "
                    f"{found} piece, but the converter needs that name (its {piece_field}) for the {role} it adds: "
                    f"train it with another {piece_field} (e.g. --{piece_field}='[{role.upper()}]'){without}"
                )
            if found != needed:
                raise TokenizerError(
                    f"the {role} piece {name!r} of the sentencepiece model is a {found} piece, not a {needed} one"
                )
        else:
            piece = model_pb2.ModelProto.SentencePiece(
                piece=name, score=0.0, type=model_pb2.ModelProto.SentencePiece.CONTROL
            )
        special[role] = piece
    if names[:NUM_SPECIAL_TOKENS] == [special[role].piece for role, *_ in _SPECIAL_ROLES] and all(
        getattr(spec, id_field) == jaxformer_id for _, jaxformer_id, _, id_field in _SPECIAL_ROLES
    ):
        return bytes(model_proto)
    ordered = [special[role] for role, *_ in _SPECIAL_ROLES]
    moved = {piece.piece for piece in ordered}
    ordered += [piece for piece in model.pieces if piece.piece not in moved]
    del model.pieces[:]
    model.pieces.extend(ordered)
    for _, jaxformer_id, _, id_field in _SPECIAL_ROLES:
        setattr(spec, id_field, jaxformer_id)
    spec.vocab_size = len(ordered)
    return model.SerializeToString(deterministic=True)


def with_control_piece(model_proto: bytes, piece: str) -> bytes:
    """The same sentencepiece model with the control piece `piece` (e.g. MASK_PIECE) after its last
    piece, unless it has it already. No text encodes to a control piece, so every sentence keeps
    its ids; the vocabulary grows by one."""
    model = model_pb2.ModelProto()
    model.ParseFromString(bytes(model_proto))
    for existing in model.pieces:
        if existing.piece == piece:
            if existing.type != model_pb2.ModelProto.SentencePiece.CONTROL:
                found = model_pb2.ModelProto.SentencePiece.Type.Name(existing.type)
                raise TokenizerError(f"the sentencepiece model's piece {piece!r} is a {found} piece, not a CONTROL one")
            return bytes(model_proto)
    model.pieces.append(
        model_pb2.ModelProto.SentencePiece(piece=piece, score=0.0, type=model_pb2.ModelProto.SentencePiece.CONTROL)
    )
    model.trainer_spec.vocab_size = len(model.pieces)
    return model.SerializeToString(deterministic=True)


def pieces_text(path: str | pathlib.Path, tokenizer: Tokenizer) -> str:
    """For a message about the size of `tokenizer`, converted from the sentencepiece model file
    `path` (`Tokenizer.from_sentencepiece_file`): the file's own piece count, and where the
    conversion added pieces, which and the count then: "<path> has 500 pieces, 501 with the
    masked LM's <mask> piece added"."""
    model = model_pb2.ModelProto()
    model.ParseFromString(pathlib.Path(path).read_bytes())  # read and converted before: a usable model
    own = {piece.piece for piece in model.pieces}
    added = [piece for piece in tokenizer.pieces(range(tokenizer.vocab_size)) if piece not in own]
    text = f"{path} has {len(model.pieces)} pieces"
    special = [piece for piece in added if piece != MASK_PIECE]
    kinds = [f"jaxformer's special piece{'s' if len(special) > 1 else ''} {', '.join(special)}"] if special else []
    kinds += [f"the masked LM's {MASK_PIECE} piece"] if MASK_PIECE in added else []
    return f"{text}, {tokenizer.vocab_size} with {' and '.join(kinds)} added" if kinds else text


def train_tokenizer(
    sentences: Iterable[str],
    vocab_size: int,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    max_sentences: int = 2_000_000,
    seed: int = 0,
    control_symbols: Sequence[str] = (),
) -> Tokenizer:
    """Trains one sentencepiece model on `sentences` (source and target text together, or one
    side's text for separate vocabularies). `control_symbols` (MASK_PIECE for a masked-LM) take
    the ids right after the special tokens and count in `vocab_size`.

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
    logger.info("training a %s sentencepiece model with %d pieces", model_type, vocab_size)
    try:
        _train_sentencepiece(sentences, model, vocab_size, model_type, character_coverage, control_symbols)
    except RuntimeError as error:  # sentencepiece reports a corpus too small for the vocabulary this way
        reason = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        raise TokenizerError(
            f"cannot train a {vocab_size}-piece {model_type} tokenizer on {len(sentences)} sentences: {reason}"
            f"{_advice(reason)}"
        ) from None
    return Tokenizer(model.getvalue())


SENTENCEPIECE_MAX_BYTES = 4192  # sentencepiece's max_sentence_length, left at its default: longer ones are not read


def _advice(reason: str) -> str:
    """Which way to move the config for sentencepiece's `reason`: a vocabulary can be too small for
    the corpus's characters as well as too large for its text."""
    if "required_chars" in reason:  # "Vocabulary size is smaller than required_chars. 20 vs 89. ..."
        return " (set a larger tokenizer.vocab_size, or a smaller tokenizer.character_coverage)"
    if "too high" in reason:  # "Vocabulary size too high (8000). Please set it to a value <= 4138."
        return " (set a smaller tokenizer.vocab_size)"
    if "!sentences_.empty()" in reason:  # every sentence over its max_sentence_length, which it leaves out
        longest = f"{SENTENCEPIECE_MAX_BYTES:,}"
        return f" (sentencepiece trains on sentences of up to {longest} bytes, and none is that short)"
    return ""


def _train_sentencepiece(
    sentences: list[str],
    model: io.BytesIO,
    vocab_size: int,
    model_type: str,
    character_coverage: float,
    control_symbols: Sequence[str],
) -> None:
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
        control_symbols=list(control_symbols),
        num_threads=2,
        minloglevel=2,
    )
