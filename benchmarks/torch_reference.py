"""The PyTorch references, sized like a jaxformer config: a seq2seq model built from
`torch.nn.Transformer` (`TorchTransformer`), and a decoder-only language model built from
`torch.nn.TransformerEncoder` under a causal mask (`TorchLanguageModel`).

Post-norm, ReLU, one embedding shared by source, target and the (tied) output projection (or, for
a config with `share_embeddings=False`, a source embedding of its own of `source_vocab_size` rows
beside the target's tied one, as jaxformer's), scaled by sqrt(d_model), sinusoidal positions,
dropout; label-smoothed cross-entropy (0.1, padding ignored); Adam(0.9, 0.98, 1e-9) with the
paper's warmup / inverse-square-root schedule and global-norm clipping at 1.0, as jaxformer's
optimizer. Greedy decoding runs the encoder once and recomputes the decoder over the whole prefix
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


def causal_mask(length: int, device=None) -> torch.Tensor:
    """[length, length] bool, True above the diagonal: the later positions a query may not see
    (`nn.Transformer.generate_square_subsequent_mask` as a boolean mask, the type of the padding masks)."""
    return torch.triu(torch.ones(length, length, dtype=torch.bool, device=device), diagonal=1)


class TiedEmbedding(nn.Module):
    """The embedding both references share: tokens scaled by sqrt(d_model) + sinusoidal
    positions + dropout in, and the tied output projection (hidden @ embedding^T) out.
    `vocab_size` (default: the config's) sets its rows: a separate source embedding's are the
    source vocabulary's."""

    def __init__(self, config: TransformerConfig, max_length: int, vocab_size: int | None = None):
        super().__init__()
        self.d_model = config.d_model
        self.embedding = nn.Embedding(vocab_size or config.vocab_size, config.d_model)
        nn.init.normal_(self.embedding.weight, std=config.d_model**-0.5)
        self.register_buffer(
            "positions", torch.from_numpy(np.array(sinusoidal_table(max_length, config.d_model))), persistent=False
        )
        self.dropout = nn.Dropout(config.dropout_rate)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        scaled = self.embedding(tokens) * math.sqrt(self.d_model)
        return self.dropout(scaled + self.positions[: tokens.shape[1]])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.embedding.weight.t()


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


def layer_options(config: TransformerConfig) -> dict:
    """nn.Transformer*Layer's arguments for a jaxformer config: post-norm, batch first."""
    return dict(
        d_model=config.d_model,
        nhead=config.num_heads,
        dim_feedforward=config.d_ff,
        dropout=config.dropout_rate,
        activation=config.activation,
        layer_norm_eps=config.layer_norm_epsilon,
        batch_first=True,
        norm_first=False,
    )


class TorchTransformer(nn.Module):
    """Embedding -> nn.Transformer (post-norm, no final stack norms, as jaxformer's post-norm) -> tied logits.

    Dropout as the jaxformer config says: `dropout_rate` on the embeddings and sublayer outputs,
    `attention_dropout_rate` on attention weights, `activation_dropout_rate` inside the FFN.
    """

    def __init__(self, config: TransformerConfig, max_length: int = 1024):
        super().__init__()
        common = layer_options(config)
        self.transformer = nn.Transformer(
            **common,
            custom_encoder=nn.TransformerEncoder(nn.TransformerEncoderLayer(**common), config.num_encoder_layers),
            custom_decoder=nn.TransformerDecoder(nn.TransformerDecoderLayer(**common), config.num_decoder_layers),
        )
        match_dropout(self.transformer, config)
        self.tied = TiedEmbedding(config, max_length)
        # Unshared (jaxformer's share_embeddings=False, multi30k's separate vocabularies): the
        # source side's own matrix, so that both sides hold, differentiate and update as many weights.
        self.source_embedding = (
            None if config.share_embeddings else TiedEmbedding(config, max_length, config.encoder_vocab_size)
        )

    def encode(self, source: torch.Tensor) -> torch.Tensor:
        embedding = self.tied if self.source_embedding is None else self.source_embedding
        with warnings.catch_warnings():  # the inference fast path's nested tensors are a "prototype"
            warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors")
            return self.transformer.encoder(embedding.embed(source), src_key_padding_mask=source == PAD_ID)

    def decode(self, memory: torch.Tensor, source: torch.Tensor, target_in: torch.Tensor) -> torch.Tensor:
        """Decoder hidden states [B, T, D] for decoder inputs `target_in` (causal, padding masked)."""
        return self.transformer.decoder(
            self.tied.embed(target_in),
            memory,
            tgt_mask=causal_mask(target_in.shape[1], target_in.device),
            tgt_is_causal=True,
            tgt_key_padding_mask=target_in == PAD_ID,
            memory_key_padding_mask=source == PAD_ID,
        )

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.tied.logits(hidden)

    def forward(self, source: torch.Tensor, target_in: torch.Tensor) -> torch.Tensor:
        return self.logits(self.decode(self.encode(source), source, target_in))


class TorchLanguageModel(nn.Module):
    """The decoder-only reference: embedding -> nn.TransformerEncoder of `num_decoder_layers`
    post-norm layers under a causal mask (a decoder without cross-attention) -> tied logits.

    Its parameters are jaxformer's `DecoderOnly`'s, one for one: per layer the Q, K, V, O
    projections with biases, two LayerNorms and the FFN; the shared embedding; no final norm
    (post-norm). Dropout as `TorchTransformer`'s.
    """

    def __init__(self, config: TransformerConfig, max_length: int = 1024):
        super().__init__()
        layer = nn.TransformerEncoderLayer(**layer_options(config))
        # enable_nested_tensor only matters to the inference fast path, off in training.
        self.layers = nn.TransformerEncoder(layer, config.num_decoder_layers, enable_nested_tensor=False)
        for weight in self.layers.parameters():  # nn.Transformer's initialisation
            if weight.dim() > 1:
                nn.init.xavier_uniform_(weight)
        match_dropout(self.layers, config)
        self.tied = TiedEmbedding(config, max_length)

    def forward(self, target_in: torch.Tensor) -> torch.Tensor:
        """Next-token logits [B, T, V] for the decoder inputs (BOS + the text shifted right)."""
        hidden = self.layers(
            self.tied.embed(target_in),
            mask=causal_mask(target_in.shape[1], target_in.device),
            is_causal=True,
            src_key_padding_mask=target_in == PAD_ID,
        )
        return self.tied.logits(hidden)


# The reference of each jaxformer architecture (`TransformerConfig.architecture`).
MODELS: dict[str, type[nn.Module]] = {"encoder_decoder": TorchTransformer, "decoder_only": TorchLanguageModel}


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
