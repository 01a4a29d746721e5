"""The PyTorch references, sized like a jaxformer config: a seq2seq model built from
`torch.nn.Transformer` (`TorchTransformer`), and a decoder-only language model built from
`torch.nn.TransformerEncoder` under a causal mask (`TorchLanguageModel`).

Each mirrors the fields of its `TransformerConfig` that change the computation, so that both
sides hold as many parameters and do the same work per step: the sizes; `normalization`
(post-norm, or pre-norm with a final LayerNorm after each stack) and `layer_norm_epsilon`; the
feed-forward `activation` (relu, exact gelu, swish or squared_relu); one embedding shared by source
and target, or (`share_embeddings=False`) a source embedding of its own of `source_vocab_size` rows;
the output projection tied to the target embedding, or (`tie_output_embedding=False`) a [V, D]
matrix of its own, with a learned [V] bias under `logits_bias`; tokens scaled by sqrt(d_model),
sinusoidal positions of `position_base` and `position_layout`; every dropout rate, word dropout
(`source_word_dropout_rate`, `target_word_dropout_rate`) included. Label-smoothed cross-entropy
(0.1, padding ignored); Adam(0.9, 0.98, 1e-9) with the paper's warmup / inverse-square-root
schedule and global-norm clipping at 1.0, as jaxformer's optimizer. A config field that changes
the math and that is not mirrored (the `encoder_only` architecture, or another model's) is refused
with a ValueError when the reference is built, before any timing. The execution choices
(`dtype`, `param_dtype`, `matmul_dtype`, `remat_policy`, `scan_layers`,
`attention_implementation`) are not read: the references compute in float32. Nor is
`deterministic`: jaxformer's train step turns dropout on whatever it says, as `model.train()`
does here. Greedy decoding runs the encoder once and recomputes the decoder over the whole prefix
at every step, as an `nn.Transformer` user does.

torch is an optional extra (`pip install 'jaxformer[torch]'`): it is imported here only, and the
benchmarks import this module only when asked for torch rows and torch is installed.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.common import cpu_count
from jaxformer.model.config import TransformerConfig
from jaxformer.model.position import sinusoidal_table
from jaxformer.tokens import BOS_ID, NUM_SPECIAL_TOKENS, PAD_ID


def set_threads(count: int | None = None) -> None:
    """torch's intra-op threads: `count`, or every core available to this process."""
    torch.set_num_threads(count or cpu_count())


set_threads()


def check_mirrored(config: TransformerConfig, architecture: str, reference: str) -> None:
    """Refuses a config whose model `reference` (of `architecture`) would not compute: every
    other field is mirrored, or leaves the math alone (see the module docstring)."""
    if config.architecture != architecture:
        raise ValueError(
            f"torch reference: architecture={config.architecture!r} is not mirrored by {reference} "
            f"(its architecture is {architecture!r})"
        )


def causal_mask(length: int, device=None) -> torch.Tensor:
    """[length, length] bool, True above the diagonal: the later positions a query may not see
    (`nn.Transformer.generate_square_subsequent_mask` as a boolean mask, the type of the padding masks)."""
    return torch.triu(torch.ones(length, length, dtype=torch.bool, device=device), diagonal=1)


def embedding_table(config: TransformerConfig, rows: int) -> nn.Embedding:
    """A token embedding matrix [rows, D], initialised N(0, d_model^-0.5) as jaxformer's `Embed`."""
    table = nn.Embedding(rows, config.d_model)
    nn.init.normal_(table.weight, std=config.d_model**-0.5)
    return table


class Embedding(nn.Module):
    """One stack's input: the tokens' rows of `table` scaled by sqrt(d_model), word dropout at
    `word_dropout_rate` (in training, each token's whole embedding zeroed with that probability,
    the rest scaled by 1 / (1 - rate)), plus sinusoidal positions (the config's `position_base`
    and `position_layout`), then dropout. Source and target share `table` when the config shares
    its embeddings."""

    def __init__(self, config: TransformerConfig, max_length: int, table: nn.Embedding, word_dropout_rate: float):
        super().__init__()
        self.d_model = config.d_model
        self.table = table
        self.word_dropout_rate = word_dropout_rate
        positions = sinusoidal_table(max_length, config.d_model, config.position_base, config.position_layout)
        self.register_buffer("positions", torch.from_numpy(np.array(positions)), persistent=False)
        self.dropout = nn.Dropout(config.dropout_rate)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        scaled = self.table(tokens) * math.sqrt(self.d_model)  # [B, L, D]
        if self.training and self.word_dropout_rate:
            keep = F.dropout(scaled.new_ones(*tokens.shape, 1), self.word_dropout_rate)  # [B, L, 1]: one bit a token
            scaled = scaled * keep
        return self.dropout(scaled + self.positions[: tokens.shape[1]])


class OutputProjection(nn.Module):
    """Logits = hidden @ W^T (+ b): W the target embedding `table` (tied), or with
    `tie_output_embedding=False` a [V, D] matrix of its own (Xavier-uniform, as jaxformer's
    logits_kernel); b, with `logits_bias`, a learned [V] bias starting at zero."""

    def __init__(self, config: TransformerConfig, table: nn.Embedding):
        super().__init__()
        self.table = table if config.tie_output_embedding else None
        untied = torch.empty(config.vocab_size, config.d_model)
        self.weight = None if config.tie_output_embedding else nn.Parameter(nn.init.xavier_uniform_(untied))
        self.bias = nn.Parameter(torch.zeros(config.vocab_size)) if config.logits_bias else None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.table.weight if self.table is not None else self.weight, self.bias)


def match_dropout(stack: nn.Module, config: TransformerConfig) -> None:
    """Gives the layers of `stack` jaxformer's separate dropout rates: nn.Transformer's layers
    have one rate for everything; matching `attention_dropout_rate` and `activation_dropout_rate`
    makes both sides do the same work (the paper: residual dropout only)."""
    for layer in stack.modules():
        if isinstance(layer, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
            layer.dropout = nn.Dropout(config.activation_dropout_rate)  # inside the feed-forward
            for attention in (layer.self_attn, getattr(layer, "multihead_attn", None)):
                if attention is not None:
                    attention.dropout = config.attention_dropout_rate


def squared_relu(x: torch.Tensor) -> torch.Tensor:
    return torch.square(F.relu(x))


# jaxformer's feed-forward non-linearities (model/layers.py) as nn.Transformer*Layer's `activation`:
# torch's own names where it has them ("gelu" is the exact erf form, as jaxformer's).
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": F.silu, "squared_relu": squared_relu}


def layer_options(config: TransformerConfig) -> dict:
    """nn.Transformer*Layer's arguments for a jaxformer config: its norm placement, batch first."""
    return dict(
        d_model=config.d_model,
        nhead=config.num_heads,
        dim_feedforward=config.d_ff,
        dropout=config.dropout_rate,
        activation=ACTIVATIONS[config.activation],
        layer_norm_eps=config.layer_norm_epsilon,
        batch_first=True,
        norm_first=config.normalization == "pre",
    )


def final_norm(config: TransformerConfig) -> nn.LayerNorm | None:
    """The LayerNorm after a pre-norm stack (jaxformer's final_norm); none after a post-norm one."""
    return nn.LayerNorm(config.d_model, eps=config.layer_norm_epsilon) if config.normalization == "pre" else None


def encoder_stack(config: TransformerConfig, num_layers: int, nested_tensor: bool = True) -> nn.TransformerEncoder:
    """`num_layers` encoder layers and the final norm. `nested_tensor` (the inference fast path's
    padding) is asked for only where the layers allow that path (post-norm, relu or gelu), as torch
    warns otherwise."""
    layer = nn.TransformerEncoderLayer(**layer_options(config))
    fast_path = config.normalization == "post" and config.activation in ("relu", "gelu")
    return nn.TransformerEncoder(
        layer, num_layers, norm=final_norm(config), enable_nested_tensor=nested_tensor and fast_path
    )


class TorchTransformer(nn.Module):
    """Embeddings -> nn.Transformer (post-norm without stack norms, or pre-norm with a final norm
    after each stack, as jaxformer's) -> output projection.

    Dropout as the jaxformer config says: `dropout_rate` on the embeddings and sublayer outputs,
    `attention_dropout_rate` on attention weights, `activation_dropout_rate` inside the FFN, word
    dropout at `source_word_dropout_rate` / `target_word_dropout_rate`.
    """

    def __init__(self, config: TransformerConfig, max_length: int = 1024):
        super().__init__()
        check_mirrored(config, "encoder_decoder", type(self).__name__)
        common = layer_options(config)
        self.transformer = nn.Transformer(
            **common,
            custom_encoder=encoder_stack(config, config.num_encoder_layers),
            custom_decoder=nn.TransformerDecoder(
                nn.TransformerDecoderLayer(**common), config.num_decoder_layers, norm=final_norm(config)
            ),
        )
        match_dropout(self.transformer, config)
        target_table = embedding_table(config, config.vocab_size)
        # Unshared (jaxformer's share_embeddings=False, multi30k's separate vocabularies): the
        # source side's own matrix, so that both sides hold, differentiate and update as many weights.
        source_table = target_table if config.share_embeddings else embedding_table(config, config.encoder_vocab_size)
        self.source_embedding = Embedding(config, max_length, source_table, config.source_word_dropout_rate)
        self.target_embedding = Embedding(config, max_length, target_table, config.target_word_dropout_rate)
        self.output = OutputProjection(config, target_table)

    def encode(self, source: torch.Tensor) -> torch.Tensor:
        with warnings.catch_warnings():  # the inference fast path's nested tensors are a "prototype"
            warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors")
            return self.transformer.encoder(self.source_embedding(source), src_key_padding_mask=source == PAD_ID)

    def decode(self, memory: torch.Tensor, source: torch.Tensor, target_in: torch.Tensor) -> torch.Tensor:
        """Decoder hidden states [B, T, D] for decoder inputs `target_in` (causal, padding masked)."""
        return self.transformer.decoder(
            self.target_embedding(target_in),
            memory,
            tgt_mask=causal_mask(target_in.shape[1], target_in.device),
            tgt_is_causal=True,
            tgt_key_padding_mask=target_in == PAD_ID,
            memory_key_padding_mask=source == PAD_ID,
        )

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.output(hidden)

    def forward(self, source: torch.Tensor, target_in: torch.Tensor) -> torch.Tensor:
        return self.logits(self.decode(self.encode(source), source, target_in))


class TorchLanguageModel(nn.Module):
    """The decoder-only reference: embedding -> nn.TransformerEncoder of `num_decoder_layers`
    layers under a causal mask (a decoder without cross-attention) -> output projection.

    Its parameters are jaxformer's `DecoderOnly`'s, one for one: per layer the Q, K, V, O
    projections with biases, two LayerNorms and the FFN; the embedding; with pre-norm the final
    norm; untied, the output matrix. Dropout as `TorchTransformer`'s (word dropout at
    `target_word_dropout_rate`).
    """

    def __init__(self, config: TransformerConfig, max_length: int = 1024):
        super().__init__()
        check_mirrored(config, "decoder_only", type(self).__name__)
        # nested tensors only matter to the inference fast path, off in training.
        self.layers = encoder_stack(config, config.num_decoder_layers, nested_tensor=False)
        for weight in self.layers.parameters():  # nn.Transformer's initialisation
            if weight.dim() > 1:
                nn.init.xavier_uniform_(weight)
        match_dropout(self.layers, config)
        table = embedding_table(config, config.vocab_size)
        self.embedding = Embedding(config, max_length, table, config.target_word_dropout_rate)
        self.output = OutputProjection(config, table)

    def forward(self, target_in: torch.Tensor) -> torch.Tensor:
        """Next-token logits [B, T, V] for the decoder inputs (BOS + the text shifted right)."""
        hidden = self.layers(
            self.embedding(target_in),
            mask=causal_mask(target_in.shape[1], target_in.device),
            is_causal=True,
            src_key_padding_mask=target_in == PAD_ID,
        )
        return self.output(hidden)


# The reference of each jaxformer architecture (`TransformerConfig.architecture`).
MODELS: dict[str, type[nn.Module]] = {"encoder_decoder": TorchTransformer, "decoder_only": TorchLanguageModel}


def build(config: TransformerConfig, max_length: int = 1024) -> nn.Module:
    """The reference of `config.architecture`; a ValueError for a config it does not mirror."""
    if config.architecture not in MODELS:
        raise ValueError(f"torch reference: architecture={config.architecture!r} is not mirrored")
    return MODELS[config.architecture](config, max_length=max_length)


def shift_right(targets: torch.Tensor) -> torch.Tensor:
    """Decoder inputs: BOS then the targets moved one place right; padding stays padding."""
    shifted = torch.cat([torch.full_like(targets[:, :1], BOS_ID), targets[:, :-1]], dim=1)
    return torch.where(targets == PAD_ID, torch.full_like(shifted, PAD_ID), shifted)


def as_tensor(array) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(np.asarray(array), dtype=np.int64))


# The profiler range of the train step's gradient clipping and optimizer update.
OPTIMIZER_RANGE = "optimizer_update"


def make_optimizer(model: nn.Module, d_model: int, warmup_steps: int = 4000):
    """Adam(0.9, 0.98, 1e-9) with lr = d^-0.5 * min(step^-0.5, step * warmup^-1.5)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)

    def rate(count: int) -> float:
        step = count + 1
        return d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, rate)


def make_train_step(model: nn.Module, d_model: int, label_smoothing: float = 0.1, clip_norm: float = 1.0):
    """A function `(source, targets) -> loss` (int64 tensors [B, S], [B, T]) doing one optimizer
    step of a `TorchTransformer`; of a `TorchLanguageModel`, `(targets) -> loss`: the model reads
    the inputs given before the targets, then shift_right(targets)."""
    optimizer, scheduler = make_optimizer(model, d_model)

    def step(*inputs: torch.Tensor) -> torch.Tensor:
        *source, targets = inputs
        model.train()
        logits = model(*source, shift_right(targets))
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            targets.reshape(-1),
            ignore_index=PAD_ID,
            label_smoothing=label_smoothing,
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        # A profiler range (a no-op unless torch.profiler runs): benchmarks.step_profile counts
        # the clipping and the update in it, as jaxformer's optimizer update outside the gradient.
        with torch.autograd.profiler.record_function(OPTIMIZER_RANGE):
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
            optimizer.step()
            scheduler.step()
        return loss.detach()

    return step


@torch.no_grad()
def greedy_decode(
    model: TorchTransformer, source: torch.Tensor, length: int, force_length: bool = False, eos_id: int = 1
) -> torch.Tensor:
    """Greedy search by recomputation: the encoder once, then the decoder over the whole prefix
    each step, projecting the last position. With `force_length`, special tokens are never
    chosen and every row gets exactly `length` tokens; else rows stop at EOS. Returns [B, <= length]."""
    model.eval()
    memory = model.encode(source)
    tokens = torch.full((source.shape[0], 1), BOS_ID, dtype=torch.long)
    finished = torch.zeros(source.shape[0], dtype=torch.bool)
    for _ in range(length):
        logits = model.logits(model.decode(memory, source, tokens)[:, -1])  # [B, V]
        if force_length:
            logits[:, :NUM_SPECIAL_TOKENS] = -math.inf
        chosen = torch.where(finished, torch.full_like(finished, PAD_ID, dtype=torch.long), logits.argmax(-1))
        tokens = torch.cat([tokens, chosen[:, None]], dim=1)
        finished |= chosen == eos_id
        if not force_length and bool(finished.all()):
            break
    return tokens[:, 1:]
