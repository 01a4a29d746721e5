"""The models' entry points refuse arrays whose shapes disagree, in one line naming both, where the
masks would broadcast a batch of 1 (or fail in jax naming neither argument)."""

import re

import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import pytest

from jaxformer.model.cache import init_cache
from jaxformer.model.config import preset
from jaxformer.model.decoder_only import DecoderOnly
from jaxformer.model.encoder_only import EncoderOnly
from jaxformer.model.shape_checks import check_positions
from jaxformer.model.transformer import Transformer

TINY = preset("tiny", deterministic=True)
S, T = 6, 5


def ids(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.int32)


def abstract_params(model, *inputs):
    return jax.eval_shape(model.init, jax.random.key(0), *inputs)["params"]


@pytest.fixture(autouse=True)
def shapes_unchecked_as_for_a_user(monkeypatch):
    """The test session's jaxtyping checks (tests/conftest.py) would refuse these shapes first; a
    user's call runs without them."""
    monkeypatch.setattr(jaxtyping.config, "jaxtyping_disable", True)


def refusal(function, *args) -> str:
    """The one-line ValueError that tracing `function` on abstract `args` raises."""
    with pytest.raises(ValueError) as error:
        jax.eval_shape(function, *args)
    message = str(error.value)
    assert "\n" not in message
    return message


TRANSLATOR_CASES = {
    "source of 2 rows, target of 1": ((2, S), (1, T), {}, "source has shape (2, 6) and target has shape (1, 5)"),
    "source of 1 row, targets of 2": ((1, S), (2, T), {}, "source has shape (1, 6) and target has shape (2, 5)"),
    "2 sources, 3 targets": ((2, S), (3, T), {}, "source has shape (2, 6) and target has shape (3, 5)"),
    "segments of 1 row": (
        (2, S),
        (2, T),
        {"source_segments": (1, S), "target_segments": (2, T)},
        "source has shape (2, 6) and source_segments has shape (1, 6)",
    ),
    "positions of another length": (
        (2, S),
        (2, T),
        {"target_positions": (2, T + 1)},
        "target has shape (2, 5) and target_positions has shape (2, 6): their target length (T) differs",
    ),
    "a 1-D target": ((2, S), (T,), {}, "target has shape (5,): it takes 2 dimensions [B, T]"),
}


@pytest.mark.parametrize("method", ["__call__", "decode"])
@pytest.mark.parametrize("case", TRANSLATOR_CASES, ids=list(TRANSLATOR_CASES))
def test_translator_refuses_source_and_target_of_other_batch_sizes(method, case):
    source_shape, target_shape, packing, expected = TRANSLATOR_CASES[case]
    model = Transformer(TINY)
    params = abstract_params(model, ids(2, S), ids(2, T))

    def apply(params, source, target, packing):
        if method == "__call__":
            return model.apply({"params": params}, source, target, **packing)
        encoded = jnp.zeros((*source.shape, TINY.d_model))  # [B, S, D], as the source
        return model.apply({"params": params}, encoded, source, target, **packing, method="decode")

    packing = {name: ids(*shape) for name, shape in packing.items()}
    assert expected in refusal(apply, params, ids(*source_shape), ids(*target_shape), packing)
    assert jax.eval_shape(apply, params, ids(2, S), ids(2, T), {}).shape == (2, T, TINY.vocab_size)


def test_decode_refuses_an_encoder_output_of_another_batch_size():
    model = Transformer(TINY)
    params = abstract_params(model, ids(2, S), ids(2, T))
    encoded = jax.ShapeDtypeStruct((1, S, TINY.d_model), jnp.float32)
    message = refusal(
        lambda p, e, s, t: model.apply({"params": p}, e, s, t, method="decode"), params, encoded, ids(2, S), ids(2, T)
    )
    assert message == "source has shape (2, 6) and encoded has shape (1, 6, 32): their batch size (B) differs"


def test_decode_refuses_an_encoder_output_of_another_width():
    """An encoder output whose last dimension is not d_model failed in the cross-attention's einsum
    ("Size of label 'D' for operand 1 (16) does not match previous terms (32)"), naming no argument."""
    model = Transformer(TINY)
    params = abstract_params(model, ids(2, S), ids(2, T))
    decode = lambda p, e, s, t: model.apply({"params": p}, e, s, t, method="decode")  # noqa: E731
    narrow = jax.ShapeDtypeStruct((2, S, TINY.d_model // 2), jnp.float32)
    assert refusal(decode, params, narrow, ids(2, S), ids(2, T)) == "encoded has shape (2, 6, 16): it takes [B, S, 32]"
    encoded = jax.ShapeDtypeStruct((2, S, TINY.d_model), jnp.float32)
    assert jax.eval_shape(decode, params, encoded, ids(2, S), ids(2, T)).shape == (2, T, TINY.vocab_size)


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.bool_])
def test_decode_refuses_an_encoder_output_that_is_not_float(dtype):
    """Integer or bool states (ids given in place of the encoder's output) were cast in the
    cross-attention's projections and gave other logits, without a word."""
    model = Transformer(TINY)
    params = abstract_params(model, ids(2, S), ids(2, T))
    decode = lambda p, e, s, t: model.apply({"params": p}, e, s, t, method="decode")  # noqa: E731
    given = jax.ShapeDtypeStruct((2, S, TINY.d_model), dtype)
    name = np.dtype(dtype).name
    message = rf"^encoded has dtype {name} \(shape \(2, 6, 32\)\): it takes the encoder's float states \[B, S, D\]"
    with pytest.raises(TypeError, match=message):
        jax.eval_shape(decode, params, given, ids(2, S), ids(2, T))
    for float_dtype in (jnp.float32, jnp.bfloat16):
        encoded = jax.ShapeDtypeStruct((2, S, TINY.d_model), float_dtype)
        assert jax.eval_shape(decode, params, encoded, ids(2, S), ids(2, T)).shape == (2, T, TINY.vocab_size)


def test_rows_of_no_tokens_are_refused_naming_the_array():
    """A source or target of length 0 failed in the attention's softmax ("zero-size array to reduction
    operation max which has no identity"), naming no argument. A batch of no rows still computes none."""
    model = Transformer(TINY)
    params = abstract_params(model, ids(2, S), ids(2, T))
    apply = lambda p, s, t: model.apply({"params": p}, s, t)  # noqa: E731
    encode = lambda p, s: model.apply({"params": p}, s, method="encode")  # noqa: E731
    suffix = "is 0, and a row holds at least one token"
    assert refusal(apply, params, ids(2, 0), ids(2, T)) == f"source has shape (2, 0): its source length (S) {suffix}"
    assert refusal(apply, params, ids(2, S), ids(2, 0)) == f"target has shape (2, 0): its target length (T) {suffix}"
    assert refusal(encode, params, ids(2, 0)) == f"source has shape (2, 0): its source length (S) {suffix}"
    decoder_only = DecoderOnly(TINY.replace(architecture="decoder_only"))
    lm_params = abstract_params(decoder_only, ids(2, T))
    lm = lambda p, x: decoder_only.apply({"params": p}, x)  # noqa: E731
    assert refusal(lm, lm_params, ids(2, 0)) == f"inputs has shape (2, 0): its target length (T) {suffix}"
    encoder_only = EncoderOnly(TINY.replace(architecture="encoder_only"))
    mlm_params = abstract_params(encoder_only, ids(2, S))
    mlm = lambda p, x: encoder_only.apply({"params": p}, x)  # noqa: E731
    assert refusal(mlm, mlm_params, ids(2, 0)) == f"tokens has shape (2, 0): its source length (S) {suffix}"
    assert jax.eval_shape(apply, params, ids(0, S), ids(0, T)).shape == (0, T, TINY.vocab_size)


def test_ids_given_as_nested_lists_are_refused_naming_the_array():
    """A nested list failed in jnp.take ("take requires ndarray or scalar arguments, got <class 'list'>"),
    naming no argument; numpy and jax arrays are read as before."""
    model = Transformer(TINY)
    params = abstract_params(model, ids(2, S), ids(2, T))
    source, target = [[5, 6, 1]], [[3, 7]]

    def apply(params, source, target, **packing):
        return jax.eval_shape(lambda p: model.apply({"params": p}, source, target, **packing), params)

    with pytest.raises(TypeError) as error:
        apply(params, source, np.array(target))
    assert str(error.value) == (
        "source is a list (shape (1, 3)): token ids, segment ids and positions are integer arrays: "
        "pass jnp.asarray(source)"
    )
    with pytest.raises(TypeError, match=r"^target_segments is a list \(shape \(1, 2\)\): "):
        apply(params, np.array(source), np.array(target), target_segments=[[1, 1]])
    assert apply(params, np.array(source), jnp.array(target)).shape == (1, 2, TINY.vocab_size)


@pytest.mark.parametrize(
    "rows, cache_rows, expected",
    [
        (
            3,
            3,
            "tokens has shape (3, 1) and the encoder context's source has shape (2, 6): decoded rows are K "
            "hypotheses per source, and 3 is not a multiple of 2",
        ),
        (1, 1, "1 is not a multiple of 2"),
        (4, 2, "tokens has shape (4, 1) and cache_keys has shape (2, 4, 9, 8): their number of rows (R) differs"),
    ],
    ids=["3 rows for 2 sources", "1 row for 2 sources", "4 rows and a cache of 2"],
)
def test_a_decoding_step_refuses_rows_that_are_not_hypotheses_of_the_sources(rows, cache_rows, expected):
    model = Transformer(TINY)
    params = abstract_params(model, ids(2, S), ids(2, T))
    context = jax.eval_shape(
        lambda p, s: model.apply({"params": p}, s, method=Transformer.encoder_context), params, ids(2, S)
    )

    def step(params, tokens, context, rows):
        cache = init_cache(TINY, rows, 9)
        return model.apply({"params": params}, tokens, cache, context, method=Transformer.decode_step)[0]

    assert expected in refusal(lambda p, t, c: step(p, t, c, cache_rows), params, ids(rows, 1), context)
    for beams in (1, 4):  # every source's hypotheses, source-major: as beam search decodes
        rows = 2 * beams
        logits = jax.eval_shape(lambda p, t, c, rows=rows: step(p, t, c, rows), params, ids(rows, 1), context)
        assert logits.shape == (rows, TINY.vocab_size)


def test_decoder_only_and_encoder_only_refuse_packing_of_another_batch_size():
    decoder_only = DecoderOnly(TINY.replace(architecture="decoder_only"))
    params = abstract_params(decoder_only, ids(2, T))
    message = refusal(lambda p, x, s: decoder_only.apply({"params": p}, x, s), params, ids(2, T), ids(1, T))
    assert message == "inputs has shape (2, 5) and segments has shape (1, 5): their batch size (B) differs"
    step = lambda p, t: decoder_only.apply({"params": p}, t, init_cache(TINY, 3, 9), method="decode_step")  # noqa: E731
    assert re.search(r"tokens has shape \(2, 1\) and cache_keys has shape \(3, ", refusal(step, params, ids(2, 1)))

    encoder_only = EncoderOnly(TINY.replace(architecture="encoder_only"))
    params = abstract_params(encoder_only, ids(2, S))
    pooled = lambda p, x, s: encoder_only.apply({"params": p}, x, None, s, method="pooled")  # noqa: E731
    message = refusal(pooled, params, ids(2, S), ids(1, S))
    assert message == "tokens has shape (2, 6) and positions has shape (1, 6): their batch size (B) differs"


def test_ids_of_a_float_or_bool_dtype_are_refused_naming_the_array():
    """A float array failed in jnp.take ('indices must have an integer type', no argument named);
    a bool one was read as PAD (0) and EOS (1) without a word."""
    model = Transformer(TINY)
    params = abstract_params(model, ids(2, S), ids(2, T))
    apply = lambda p, s, t, packing: model.apply({"params": p}, s, t, **packing)  # noqa: E731
    encode = lambda p, s: model.apply({"params": p}, s, method="encode")  # noqa: E731
    floats, bools = jax.ShapeDtypeStruct((2, S), jnp.float32), jax.ShapeDtypeStruct((2, T), jnp.bool_)
    cases = [
        (apply, (params, floats, ids(2, T), {}), "source has dtype float32 (shape (2, 6))"),
        (apply, (params, ids(2, S), bools, {}), "target has dtype bool (shape (2, 5))"),
        (apply, (params, ids(2, S), ids(2, T), {"target_segments": bools}), "target_segments has dtype bool"),
        (encode, (params, floats), "source has dtype float32"),
    ]
    decoder_only = DecoderOnly(TINY.replace(architecture="decoder_only"))
    lm_params = abstract_params(decoder_only, ids(2, T))
    cases.append((lambda p, x: decoder_only.apply({"params": p}, x), (lm_params, bools), "inputs has dtype bool"))
    step = lambda p, t: decoder_only.apply({"params": p}, t, init_cache(TINY, 2, 9), method="decode_step")  # noqa: E731
    cases.append((step, (lm_params, jax.ShapeDtypeStruct((2, 1), jnp.float32)), "tokens has dtype float32"))
    encoder_only = EncoderOnly(TINY.replace(architecture="encoder_only"))
    mlm_params = abstract_params(encoder_only, ids(2, S))
    cases.append((lambda p, x: encoder_only.apply({"params": p}, x), (mlm_params, floats), "tokens has dtype float32"))
    for function, args, expected in cases:
        with pytest.raises(TypeError) as error:
            jax.eval_shape(function, *args)
        assert str(error.value).startswith(expected) and "\n" not in str(error.value)
        assert str(error.value).endswith("token ids, segment ids and positions are integer arrays")
    for dtype in (jnp.int8, jnp.uint16, jnp.int64):  # any integer dtype is read as it was
        assert jax.eval_shape(apply, params, jax.ShapeDtypeStruct((2, S), dtype), ids(2, T), {}).shape[:2] == (2, T)


def zero_params(model, *inputs):
    """Parameters of the model's shapes, without running its init: the refusals come before any work."""
    return jax.tree.map(lambda leaf: jnp.zeros(leaf.shape, leaf.dtype), abstract_params(model, *inputs))


def test_concrete_positions_outside_their_rows_are_refused_naming_the_array():
    """Positions index a row's sinusoid table of L entries; one outside [0, L) read the table's nearest
    end (jnp.take's clip), so positions continuing past the row gave wrong logits without a word."""
    model = Transformer(TINY)
    source, target = jnp.ones((2, S), jnp.int32), jnp.ones((2, T), jnp.int32)
    params = zero_params(model, ids(2, S), ids(2, T))
    apply = lambda **packing: model.apply({"params": params}, source, target, **packing)  # noqa: E731
    counted = np.broadcast_to(np.arange(T), (2, T))
    past_the_row = counted.copy()
    past_the_row[0, 4] = T
    negative = counted.copy()
    negative[1, 2] = -1
    cases = [
        (past_the_row, "target_positions holds 5 at row 0, column 4, outside [0, 5)"),
        (jnp.asarray(negative), "target_positions holds -1 at row 1, column 2, outside [0, 5)"),
        (np.full((2, T), 40), "target_positions holds 40 at row 0, column 0, outside [0, 5)"),
    ]
    for positions, expected in cases:
        with pytest.raises(ValueError) as error:
            apply(target_positions=positions)
        assert str(error.value).startswith(expected) and "\n" not in str(error.value)
    too_far = jnp.broadcast_to(jnp.arange(1, S + 1), (2, S))
    with pytest.raises(ValueError, match=r"^source_positions holds 6 at row 0, column 5, outside \[0, 6\)"):
        model.apply({"params": params}, source, source_positions=too_far, method="encode")
    with pytest.raises(ValueError, match=r"^source_positions holds 6 at row 0, column 5"):
        apply(source_positions=too_far)
    # Traced values (jax.jit, here eval_shape) cannot be checked, as README says; nor need in-range ones be refused.
    logits = jax.eval_shape(lambda positions: apply(target_positions=positions), past_the_row)
    assert logits.shape == (2, T, TINY.vocab_size)
    check_positions(source_positions=np.zeros((2, S), np.int32), target_positions=jnp.asarray(counted))

    decoder_only = DecoderOnly(TINY.replace(architecture="decoder_only"))
    lm_params = zero_params(decoder_only, ids(2, T))
    with pytest.raises(ValueError, match=r"^positions holds 5 at row 0, column 4, outside \[0, 5\)"):
        decoder_only.apply({"params": lm_params}, target, positions=past_the_row)
    encoder_only = EncoderOnly(TINY.replace(architecture="encoder_only"))
    mlm_params = zero_params(encoder_only, ids(2, S))
    with pytest.raises(ValueError, match=r"^positions holds 6 at row 0, column 5, outside \[0, 6\)"):
        encoder_only.apply({"params": mlm_params}, source, positions=too_far, method="pooled")
