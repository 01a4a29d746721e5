"""The train state: one pytree holding everything a resumed run needs from the device."""

from __future__ import annotations

from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32 []: train steps taken (micro-batches when accumulating)
    params: Any  # the model parameters, plain arrays
    opt_state: optax.OptState
    rng: jax.Array  # uint32 [2]: base key; step s uses fold_in(rng, s) for dropout

    def dropout_key(self) -> jax.Array:
        """The dropout key of the step this state is about to take: fold_in(rng, step)."""
        return jax.random.fold_in(self.rng, self.step)


def init_params(model: nn.Module, rng: jax.Array, source_length: int, target_length: int, *, boxed: bool = False):
    """Random parameters of `model` (any architecture), initialised on [1, source_length] /
    [1, target_length] rows of ones (the encoder's / the decoder's): plain arrays, or with
    `boxed=True` still carrying their logical axis names."""
    source = jnp.ones((1, source_length), jnp.int32)
    target = jnp.ones((1, target_length), jnp.int32)
    inputs = {"encoder_decoder": (source, target), "encoder_only": (source,), "decoder_only": (target,)}
    params = model.init(rng, *inputs[model.config.architecture], deterministic=True)["params"]
    return params if boxed else nn.meta.unbox(params)


def make_init_fn(
    model: nn.Module,
    optimizer: optax.GradientTransformation,
    source_length: int,
    target_length: int,
    *,
    boxed: bool = False,
):
    """A function `seed -> TrainState`, to run under `jax.eval_shape` then `jax.jit`.

    With `boxed=True` parameters and optimizer moments keep their logical axis names
    (`nn.LogicallyPartitioned`), for `jax.eval_shape` and the sharding rules; the state that
    training uses is the unboxed one, with the same tree structure once unboxed.
    """

    def init(seed: jax.Array) -> TrainState:
        rng = jax.random.PRNGKey(seed)
        init_rng, dropout_rng = jax.random.split(rng)
        params = init_params(model, init_rng, source_length, target_length, boxed=boxed)
        return TrainState(
            step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params), rng=dropout_rng
        )

    return init


def count_parameters(params: Any) -> int:
    """The number of scalars in a parameter tree (plain or abstract arrays)."""
    return sum(int(leaf.size) for leaf in jax.tree.leaves(params))
