"""A source longer than the model's positions (model.max_positions, an imported model's): refused
by translate_ids, and a max_source_tokens past them refused before the parameters are read."""

import re

import numpy as np
import pytest

from jaxformer.decoding.translator import Translator
from jaxformer.tokens import EOS_ID, PAD_ID
from tests.decoding.test_translator import GREEDY, translator  # noqa: F401 (translator: the fixture)

# ruff: noqa: F811 (each test takes the imported translator fixture as its argument)

pytestmark = pytest.mark.xdist_group("decoding-workdir")


def test_translate_ids_refuses_a_source_past_the_models_positions(translator):
    """A source of more ids than the model's max_positions (an imported model's) ran, computing
    positions the model never had, where translate splits such a sentence: it is refused, naming
    its index, length and the limit, before any batch runs. The padding after its EOS is no position."""
    positions, searched = 6, []

    def search(params, source, rng):  # the search's output shapes, without the search
        searched.append(np.asarray(source).tolist())
        return np.zeros((len(source), 1, source.shape[1] + 8), np.int32), np.zeros((len(source), 1), np.float32)

    def with_positions(max_positions):
        model = translator.config.replace(max_positions=max_positions)
        bounded = Translator(model, translator.params, translator.tokenizer, GREEDY, length_bucket=1)
        bounded._generate = search
        return bounded

    fits, longer = [5] * (positions - 1) + [EOS_ID], [5] * positions + [EOS_ID]
    with pytest.raises(
        ValueError,
        match=rf"^source 1 has {positions + 1} ids \(EOS included\), more than the model's {positions} positions "
        r"\(model.max_positions\): ",
    ):
        with_positions(positions).translate_ids([fits, longer])
    assert not searched
    with_positions(positions).translate_ids([fits + [PAD_ID] * 3])
    with_positions(None).translate_ids([longer])  # no limit without max_positions
    assert searched == [[fits], [longer]]


def test_max_source_tokens_past_the_models_positions_is_refused_before_parameters_are_read(
    translator, decoding_workdir, monkeypatch, tmp_path, capsys
):
    """A model with a last position (model.max_positions, an imported MarianMT model's) took any
    max_source_tokens and translated in pieces of its positions instead, silently; one given past
    them is refused, naming the value and the limit, before the parameters are read or anything
    is compiled (translate's --max_source_tokens as the commands print a ConfigError: one line).
    None given: 256, or the model's positions where fewer, as before."""
    from jaxformer.commands import translate
    from jaxformer.run.checkpoint import Checkpointer
    from jaxformer.run.metadata import CheckpointMetadata

    positions = 50
    message = (
        f"max_source_tokens={positions + 1} is more than the model's {positions} positions (model.max_positions): "
        f"give at most {positions}, or none (longer lines are translated in pieces)"
    )
    model_config = CheckpointMetadata.model_config
    with monkeypatch.context() as patched:
        patched.setattr(
            CheckpointMetadata, "model_config", lambda self: model_config(self).replace(max_positions=positions)
        )
        patched.setattr(Checkpointer, "_restore_params", lambda *args: pytest.fail("the parameters were read"))
        with pytest.raises(ValueError) as refused:
            Translator.from_workdir(decoding_workdir, settings=GREEDY, max_source_tokens=positions + 1)
        assert str(refused.value) == message
        (tmp_path / "input.txt").write_text("A dog runs.\n")
        flags = ["--workdir", str(decoding_workdir), "--input", str(tmp_path / "input.txt"), "--method", "greedy"]
        flags += ["--output", str(tmp_path / "out.txt"), "--max_source_tokens", str(positions + 1)]
        assert translate.main(flags) == 2
        assert capsys.readouterr().err.splitlines()[-1] == f"error: {message}"
        assert not (tmp_path / "out.txt").exists()
    parts = (translator.config.replace(max_positions=positions), None, translator.tokenizer, GREEDY)
    with pytest.raises(ValueError, match=re.escape(message)):
        Translator(*parts, max_source_tokens=positions + 1)
    assert Translator(*parts, max_source_tokens=positions).max_source_tokens == positions
    assert Translator(*parts).max_source_tokens == positions  # 256 where none is given, at most the positions
    assert Translator(parts[0].replace(max_positions=None), *parts[1:]).max_source_tokens == 256
