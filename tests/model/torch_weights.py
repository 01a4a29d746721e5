"""jaxformer's layer parameters copied into torch.nn.TransformerEncoder / TransformerDecoder
stacks, for the tests that compare the two models weight for weight. torch is not imported here:
each tensor is made by the parameter it replaces (`new_tensor`), so a test module may import this
one before its pytest.importorskip of torch."""

import numpy as np


def assign(parameter, array, transpose=False):
    """Replaces `parameter`'s values with `array` (transposed: flax's x W against torch's x W^T),
    refusing another shape rather than letting torch broadcast it."""
    array = np.asarray(array, np.float32)
    array = array.T if transpose else array
    assert tuple(parameter.shape) == array.shape, (tuple(parameter.shape), array.shape)
    parameter.data = parameter.new_tensor(np.ascontiguousarray(array))


def load_norm(norm, flax_norm):
    assign(norm.weight, flax_norm["scale"])
    assign(norm.bias, flax_norm["bias"])


def load_attention(attention, flax_attention):
    """torch.nn.MultiheadAttention from flax's per-head projections: torch's packed input
    projection holds the rows of query, key and value in turn, heads contiguous, which is each
    [D, N, H] kernel flattened to [D, D]."""
    d_model = attention.embed_dim
    names = ("query", "key", "value")
    in_kernel = np.concatenate([flax_attention[f"{name}_kernel"].reshape(d_model, d_model) for name in names], axis=1)
    assign(attention.in_proj_weight, in_kernel, transpose=True)
    assign(attention.in_proj_bias, np.concatenate([flax_attention[f"{name}_bias"].reshape(-1) for name in names]))
    assign(attention.out_proj.weight, flax_attention["out_kernel"].reshape(d_model, d_model), transpose=True)
    assign(attention.out_proj.bias, flax_attention["out_bias"])


def load_layer(layer, flax_layer):
    """One torch.nn.TransformerEncoderLayer or TransformerDecoderLayer (norm1 the self-attention's,
    then the cross-attention's where the layer has one, then the feed-forward's)."""
    load_attention(layer.self_attn, flax_layer["self_attention"])
    norms = [layer.norm1, layer.norm2]
    flax_norms = ["self_attention_norm", "feed_forward_norm"]
    if hasattr(layer, "multihead_attn"):
        load_attention(layer.multihead_attn, flax_layer["cross_attention"])
        norms.append(layer.norm3)
        flax_norms.insert(1, "cross_attention_norm")
    for norm, name in zip(norms, flax_norms, strict=True):
        load_norm(norm, flax_layer[name])
    feed_forward = flax_layer["feed_forward"]
    assign(layer.linear1.weight, feed_forward["wi_kernel"], transpose=True)
    assign(layer.linear1.bias, feed_forward["wi_bias"])
    assign(layer.linear2.weight, feed_forward["wo_kernel"], transpose=True)
    assign(layer.linear2.bias, feed_forward["wo_bias"])


def load_stack(stack, flax_stack):
    """A torch encoder or decoder stack from flax's `encoder` or `decoder` parameters: its layers,
    and the final LayerNorm a pre-norm stack ends in."""
    flax_layers = [name for name in flax_stack if name.startswith("layer_")]
    assert len(stack.layers) == len(flax_layers), (len(stack.layers), flax_layers)
    assert (stack.norm is None) == ("final_norm" not in flax_stack), (stack.norm, list(flax_stack))
    for index, layer in enumerate(stack.layers):
        load_layer(layer, flax_stack[f"layer_{index}"])
    if stack.norm is not None:
        load_norm(stack.norm, flax_stack["final_norm"])
