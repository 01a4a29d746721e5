"""Embeddings (shared and tied), the position-wise feed-forward network, and the
residual + LayerNorm connection around every sub-layer."""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxformer.model.config import TransformerConfig
from jaxformer.model.position import positional_encoding
from jaxformer.typing import Array, Float, Int


class Embed(nn.Module):
    """Token embedding scaled by sqrt(d_model) (section 3.4); `attend` gives tied output logits.

    Initialised N(0, d_model^-0.5), so scaled embeddings start with unit variance, as in
    tensor2tensor and fairseq.
    """

    config: TransformerConfig

    def setup(self):
        config = self.config
        init = nn.initializers.normal(stddev=config.d_model**-0.5)
        self.embedding = self.param(
            "embedding", nn.with_logical_partitioning(init, ("vocab", "embed")),
            (config.vocab_size, config.d_model), config.param_dtype,
        )

    def __call__(self, tokens: Int[Array, "B L"]) -> Float[Array, "B L D"]:
        config = self.config
        embedded = jnp.take(self.embedding, tokens, axis=0).astype(config.dtype)  # [B, L, D]
        return embedded * jnp.sqrt(config.d_model).astype(config.dtype)

    def attend(self, hidden: Float[Array, "B T D"]) -> Float[Array, "B T V"]:
        """Logits against every vocabulary entry, float32: hidden E^T."""
        config = self.config
        return jnp.einsum(
            "BTD,VD->BTV", hidden.astype(config.dtype), self.embedding.astype(config.dtype),
            preferred_element_type=jnp.float32,
        )


# Logical names of the residual stream [B, L, D]; constrained at block boundaries only.
ACTIVATION_AXES = ("batch", "length", "embed")


def constrain(x: Float[Array, "B L D"]) -> Float[Array, "B L D"]:
    """Pins the residual stream's layout under the active logical axis rules (no-op without them)."""
    return nn.with_logical_constraint(x, ACTIVATION_AXES)


def embed_with_positions(
    embed: Embed,
    tokens: Int[Array, "B L"],
    positions: Int[Array, "B L"] | None,
    deterministic: bool,
) -> Float[Array, "B L D"]:
    """Dropout(scaled token embedding + positional encoding), the input of either stack.

    Call from a compact module's method: the dropout layer is created in that module.
    """
    config = embed.config
    x = embed(tokens)  # [B, L, D]
    encoding = positional_encoding(tokens.shape[1], config.d_model, positions, config.position_base)  # [1|B, L, D]
    x = x + encoding.astype(config.dtype)
    return constrain(nn.Dropout(config.dropout_rate)(x, deterministic=deterministic))


def activation_function(name: str) -> Callable[[Array], Array]:
    """The feed-forward non-linearity by name: "relu" (the paper) or "gelu" (exact erf form)."""
    functions = {"relu": jax.nn.relu, "gelu": lambda x: jax.nn.gelu(x, approximate=False)}
    if name not in functions:
        raise ValueError(f"unknown activation {name!r}; choose one of {', '.join(functions)}")
    return functions[name]


class FeedForward(nn.Module):
    """FFN(x) = act(x W1 + b1) W2 + b2 (section 3.3), with dropout after the activation."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, inputs: Float[Array, "B L D"], deterministic: bool) -> Float[Array, "B L D"]:
        config = self.config
        kernel_init = nn.initializers.xavier_uniform()
        zeros = nn.initializers.zeros_init()

        def param(name, init, names, shape):
            value = self.param(name, nn.with_logical_partitioning(init, names), shape, config.param_dtype)
            return value.astype(config.dtype)

        w_in = param("wi_kernel", kernel_init, ("embed", "mlp"), (config.d_model, config.d_ff))
        b_in = param("wi_bias", zeros, ("mlp",), (config.d_ff,))
        w_out = param("wo_kernel", kernel_init, ("mlp", "embed"), (config.d_ff, config.d_model))
        b_out = param("wo_bias", zeros, ("embed",), (config.d_model,))

        hidden = jnp.einsum("BLD,DF->BLF", inputs.astype(config.dtype), w_in) + b_in[None, None]  # [B, L, F]
        hidden = activation_function(config.activation)(hidden)
        hidden = nn.Dropout(config.activation_dropout_rate)(hidden, deterministic=deterministic)
        return jnp.einsum("BLF,FD->BLD", hidden, w_out) + b_out[None, None]  # [B, L, D]


def layer_norm(config: TransformerConfig, name: str) -> nn.LayerNorm:
    """LayerNorm over the model width; statistics in float32 whatever the compute dtype."""
    return nn.LayerNorm(
        epsilon=config.layer_norm_epsilon, dtype=config.dtype, param_dtype=config.param_dtype,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("embed",)),
        name=name,
    )


def residual(
    inputs: Float[Array, "B L D"],
    sublayer: Callable[[Array], Array],
    norm: nn.LayerNorm,
    dropout: Callable[[Array], Array],
    normalization: str,
) -> Float[Array, "B L D"]:
    """Post-norm LayerNorm(x + Dropout(Sublayer(x))) (section 5.4), or pre-norm
    x + Dropout(Sublayer(LayerNorm(x)))."""
    if normalization == "pre":
        return inputs + dropout(sublayer(norm(inputs)))
    return norm(inputs + dropout(sublayer(inputs)))


REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_saveable,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


class _ScanBody(nn.Module):
    """Adapts a layer to nn.scan: (carry, *broadcast inputs) -> (carry, None)."""

    layer_cls: type
    config: TransformerConfig
    deterministic: bool

    @nn.compact
    def __call__(self, x, *inputs):
        return constrain(self.layer_cls(self.config, name="layer")(x, *inputs, self.deterministic)), None


def run_layers(
    layer_cls: type, config: TransformerConfig, num_layers: int, x: Float[Array, "B L D"], *inputs, deterministic: bool
) -> Float[Array, "B L D"]:
    """x through `num_layers` layers `layer_cls(config)(x, *inputs, deterministic)`, each
    rematerialised as `config.remat_policy` says; separate modules `layer_0`, `layer_1`, ...
    or, with `config.scan_layers`, one scanned module `layers` with stacked parameters.

    Call from a compact module's method: the layers are created in that module.
    """
    if config.remat_policy != "none":
        deterministic_argnum = len(inputs) + 2  # self, x, *inputs, deterministic
        layer_cls = nn.remat(layer_cls, policy=REMAT_POLICIES[config.remat_policy], static_argnums=(deterministic_argnum,))
    if config.scan_layers:
        scanned = nn.scan(
            _ScanBody,
            variable_axes={"params": 0},
            split_rngs={"params": True, "dropout": True},
            in_axes=(nn.broadcast,) * len(inputs),
            length=num_layers,
            metadata_params={nn.PARTITION_NAME: "layers"},
        )
        x, _ = scanned(layer_cls, config, deterministic, name="layers")(x, *inputs)
        return x
    for index in range(num_layers):
        x = constrain(layer_cls(config, name=f"layer_{index}")(x, *inputs, deterministic))
    return x

