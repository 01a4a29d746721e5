"""Embeddings (shared and tied), the position-wise feed-forward network, and the
residual + LayerNorm connection around every sub-layer."""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxformer.model.config import TransformerConfig
from jaxformer.model.dropout import Dropout
from jaxformer.model.position import positional_encoding, segment_positions
from jaxformer.model.projection import WEIGHT_PRODUCT, project
from jaxformer.typing import Array, Float, Int


class Embed(nn.Module):
    """Token embedding scaled by sqrt(d_model) (section 3.4); `attend` gives tied output logits.

    Initialised N(0, d_model^-0.5), so scaled embeddings start with unit variance, as in
    tensor2tensor and fairseq.
    """

    config: TransformerConfig
    vocab_size: int | None = None  # rows; None: config.vocab_size (a source embedding passes its own)

    def setup(self):
        config = self.config
        init = nn.initializers.normal(stddev=config.d_model**-0.5)
        self.embedding = self.param(
            "embedding",
            nn.with_logical_partitioning(init, ("vocab", "embed")),
            (config.vocab_size if self.vocab_size is None else self.vocab_size, config.d_model),
            config.param_dtype,
        )

    def __call__(self, tokens: Int[Array, "B L"]) -> Float[Array, "B L D"]:
        config = self.config
        # The lookup reads whole rows: the table gathered along `embed`, as FSDP gathers every weight
        # it uses. Rows split along D (embed -> fsdp) left XLA no way to the batch-split activations
        # but replicating them (its "Involuntary full rematerialization" warnings, both passes).
        table = nn.with_logical_constraint(self.embedding, ("vocab", None))
        embedded = jnp.take(table, tokens, axis=0).astype(config.dtype)  # [B, L, D]
        return embedded * jnp.sqrt(config.d_model).astype(config.dtype)

    def attend(self, hidden: Float[Array, "B T D"]) -> Float[Array, "B T V"]:
        """Logits against every vocabulary entry, float32: hidden E^T (operands in the matmul dtype)."""
        operands = self.config.matmul_operand_dtype
        return jnp.einsum(
            "BTD,VD->BTV",
            hidden.astype(operands),
            self.embedding.astype(operands),
            preferred_element_type=jnp.float32,
        )


# Logical names of the residual stream [B, L, D]; constrained at block boundaries only.
ACTIVATION_AXES = ("batch", "length", "embed")


def constrain(x: Float[Array, "B L D"]) -> Float[Array, "B L D"]:
    """Pins the residual stream's layout under the active logical axis rules (no-op without them)."""
    return nn.with_logical_constraint(x, ACTIVATION_AXES)


def embed_with_positions(
    embed: Embed,
    dropout: nn.Module,
    tokens: Int[Array, "B L"],
    positions: Int[Array, "B L"] | None,
    deterministic: bool,
    table_length: int | None = None,
    word_dropout: nn.Module | None = None,
    segments: Int[Array, "B L"] | None = None,
) -> Float[Array, "B L D"]:
    """Dropout(scaled token embedding + positional encoding), the input of either stack; with
    `word_dropout`, whole token embeddings are dropped before the positions are added.

    `table_length` (default L) bounds the positions: a decoding step embeds one token at
    position i of a longer output. `segments` given without `positions` (a packed row) restart the
    positions in each segment, as the pipeline's do.
    """
    config = embed.config
    if positions is None and segments is not None:
        positions = segment_positions(segments)  # [B, L]
    x = embed(tokens)  # [B, L, D]
    if word_dropout is not None:
        x = word_dropout(x, deterministic=deterministic)  # [B, L, D]
    length = tokens.shape[1] if table_length is None else table_length
    encoding = positional_encoding(
        length, config.d_model, positions, config.position_base, config.position_layout
    )  # [1|B, L, D]
    x = x + encoding.astype(config.dtype)
    return constrain(dropout(x, deterministic=deterministic))


def activation_function(name: str) -> Callable[[Array], Array]:
    """The feed-forward non-linearity by name: "relu" (the paper), "gelu" (exact erf form), "swish"
    (SiLU, x * sigmoid(x)) or "squared_relu" (relu(x)^2)."""
    functions = {
        "relu": jax.nn.relu,
        "gelu": lambda x: jax.nn.gelu(x, approximate=False),
        "swish": jax.nn.silu,
        "squared_relu": lambda x: jnp.square(jax.nn.relu(x)),
    }
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

        operands = config.matmul_operand_dtype
        hidden = project("BLD,DF->BLF", inputs.astype(config.dtype), w_in, operands) + b_in[None, None]  # [B, L, F]
        hidden = activation_function(config.activation)(hidden)
        hidden = Dropout(config.activation_dropout_rate)(hidden, deterministic=deterministic)
        return project("BLF,FD->BLD", hidden, w_out, operands) + b_out[None, None]  # [B, L, D]


def layer_norm(config: TransformerConfig, name: str | None = None) -> nn.LayerNorm:
    """LayerNorm over the model width; statistics in float32 whatever the compute dtype."""
    return nn.LayerNorm(
        epsilon=config.layer_norm_epsilon,
        dtype=config.dtype,
        param_dtype=config.param_dtype,
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


# The dots policies also keep the named bf16 weight products (projection.py), which reach remat
# as custom_vjp calls rather than dot_generals.
_WEIGHT_PRODUCTS = jax.checkpoint_policies.save_only_these_names(WEIGHT_PRODUCT)
REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.save_from_both_policies(jax.checkpoint_policies.dots_saveable, _WEIGHT_PRODUCTS),
    "dots_no_batch": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable, _WEIGHT_PRODUCTS
    ),
}


class _ScanBody(nn.Module):
    """Adapts a layer to nn.scan: (carry, *broadcast inputs, deterministic) -> (carry, None)."""

    layer_cls: type
    config: TransformerConfig

    @nn.compact
    def __call__(self, x, *inputs_and_deterministic):
        return constrain(self.layer_cls(self.config, name="layer")(x, *inputs_and_deterministic)), None


class LayerStack(nn.Module):
    """`num_layers` layers `layer_cls(config)(x, *inputs, deterministic)`, each rematerialised as
    `config.remat_policy` says: separate modules `layer_0`, `layer_1`, ... or, with
    `config.scan_layers`, one scanned module `layers/layer` with stacked parameters.

    Its parameters live in the parent's scope (`nn.share_scope`), so the tree reads
    `encoder/layer_0/...` whichever way the stack is built.
    """

    layer_cls: type
    config: TransformerConfig
    num_layers: int
    num_inputs: int  # broadcast inputs after x (masks, encoder output)

    def setup(self):
        config, layer_cls = self.config, self.layer_cls
        if config.remat_policy != "none":
            deterministic_argnum = self.num_inputs + 2  # self, x, *inputs, deterministic
            layer_cls = nn.remat(
                layer_cls, policy=REMAT_POLICIES[config.remat_policy], static_argnums=(deterministic_argnum,)
            )
        if config.scan_layers:
            self.layers = nn.scan(
                _ScanBody,
                variable_axes={"params": 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=(nn.broadcast,) * (self.num_inputs + 1),
                length=self.num_layers,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )(layer_cls, config)
        else:
            self.layer = [layer_cls(config) for _ in range(self.num_layers)]

    def __call__(self, x: Float[Array, "B L D"], *inputs, deterministic: bool) -> Float[Array, "B L D"]:
        if self.config.scan_layers:
            x, _ = self.layers(x, *inputs, deterministic)
            return x
        for layer in self.layer:
            x = constrain(layer(x, *inputs, deterministic))
        return x

    def unscanned(self) -> list[nn.Module]:
        """The layers one by one (for incremental decoding); scanned stacks must be unstacked first."""
        if self.config.scan_layers:
            raise ValueError(
                "incremental decoding needs separate layers: unstack the parameters with "
                "jaxformer.model.transformer.unstack_layers and use config.replace(scan_layers=False)"
            )
        return list(self.layer)


class EmbeddedStack(nn.Module):
    """The frame the encoder and the decoder share: token embeddings with positions and input
    dropout, a `LayerStack`, and with pre-norm a final LayerNorm. Subclasses call `_build` in
    their `setup` and `_final` on the stack's output."""

    config: TransformerConfig
    embed: Embed

    def _build(self, layer_cls: type, num_layers: int, num_inputs: int, word_dropout_rate: float = 0.0) -> None:
        config = self.config
        self.input_dropout = Dropout(config.dropout_rate)
        # Word dropout (one bit per token: its whole embedding [D] dropped or kept), created only when
        # on, so that models without it keep the module tree they always had.
        self.word_dropout = Dropout(word_dropout_rate, broadcast_dims=(-1,)) if word_dropout_rate else None
        self.stack = LayerStack(layer_cls, config, num_layers, num_inputs=num_inputs)
        nn.share_scope(self, self.stack)  # parameters read encoder/layer_0/..., not encoder/stack/...
        if config.normalization == "pre":
            self.final_norm = layer_norm(config)

    def _final(self, y: Float[Array, "B L D"]) -> Float[Array, "B L D"]:
        return self.final_norm(y) if self.config.normalization == "pre" else y
