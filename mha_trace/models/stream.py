"""The residual stream split by where it comes from, exactly: what `explain --why` reads.

Each layer adds to the stream (its attention's output, its MLP's) or normalises it. A LayerNorm or
an RMSNorm is linear once its scale is frozen at the value it computed on this sentence, so every
part goes through it on its own: a LayerNorm takes p to γ (p - mean p) / σ and adds β to the
biases, an RMSNorm takes p to w p / rms. The parts (float64) then sum to the real stream, and the
attention input of a layer is split the same way. The sources: the token embedding, the position
embedding (MiniLM, a trained run, Whisper's decoder; SmolLM2 has none: RoPE turns q and k inside the
attention), each earlier layer's attention output (or each of its heads') and MLP output, an
encoder-decoder's cross-attention output (what the decoder heard: its heads are L.X1, L.X2, ...),
and the biases (LayerNorm shifts, output biases, BERT's constant segment embedding).

A model says what it has: `embedding_parts(ids)`, `stream_steps(layer)` (what changes the stream
in a layer, in order: its attention, a LayerNorm, the MLP's last Linear; layer 0: after the
embeddings) and `attention_norm_of(layer)` (the norm its attention reads through, or None).
"""

import torch
import torch.nn as nn

from mha_trace.core.attention import MultiHeadAttention


def stream_parts(model, ids, layer: int, by_head: bool = False) -> dict:
    """{source: (T, D) float64}, summing to what layer `layer`'s attention reads on `ids`."""
    steps = [model.stream_steps(l) for l in range(layer)]
    seen: dict = {}
    hooks = [_watch(m, seen) for l in range(1, layer) for m in steps[l]
             if isinstance(m, (MultiHeadAttention, nn.Linear))]  # a norm is frozen from the parts
    with torch.no_grad():
        try:
            parts = {name: p.double() for name, p in model.embedding_parts(ids).items()}
            if layer > 1:  # the layers below, once, to see what each one adds
                model.run(list(ids), last=layer - 1)
        finally:
            for hook in hooks:
                hook.remove()
        for l, modules in enumerate(steps):
            attentions = 0
            for m in modules:
                attentions += isinstance(m, MultiHeadAttention)
                parts = _through(m, parts, seen.get(m), l, by_head, attentions > 1)
        norm = model.attention_norm_of(layer)
        return parts if norm is None else _through(norm, parts, None, layer, by_head)


def _watch(m, seen: dict):
    """Keep what the stream gains at m: an attention's heads side by side (W_o's input), a
    Linear's output."""
    if isinstance(m, MultiHeadAttention):
        return m.W_o.register_forward_pre_hook(lambda _, args: seen.__setitem__(m, args[0][0]))
    return m.register_forward_hook(lambda _, __, out: seen.__setitem__(m, out[0]))


def _through(m, parts: dict, value, layer: int, by_head: bool, cross: bool = False) -> dict:
    if isinstance(m, MultiHeadAttention):
        return _added(parts, _heads(m, value.double(), layer, by_head, cross))
    if isinstance(m, nn.Linear):
        out = value.double()
        if m.bias is None:
            return _added(parts, {f"L{layer} MLP": out})
        bias = m.bias.double().expand_as(out)
        return _added(parts, {f"L{layer} MLP": out - bias, "biases": bias})
    z = sum(parts.values())
    if isinstance(m, nn.LayerNorm):
        sigma = torch.sqrt(z.var(-1, unbiased=False, keepdim=True) + m.eps)
        g = m.weight.double()
        normed = {k: g * (p - p.mean(-1, keepdim=True)) / sigma for k, p in parts.items()}
        return _added(normed, {"biases": m.bias.double().expand_as(z)})
    scale = torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + m.eps) * m.weight.double()  # RMSNorm
    return {k: p * scale for k, p in parts.items()}


def _heads(attention, concat: torch.Tensor, layer: int, by_head: bool, cross: bool) -> dict:
    """What the attention adds: each head's slice of the concatenation through its columns of
    W_o (one source per head, or their sum), and W_o's bias among the biases. A layer's second
    attention reads another sequence (an encoder-decoder's cross-attention: what it heard)."""
    W, d = attention.W_o.weight.double(), attention.d_k
    heads = {f"L{layer}.{'X' if cross else 'H'}{h + 1}": concat[:, h * d:(h + 1) * d] @ W[:, h * d:(h + 1) * d].T
             for h in range(attention.heads)}
    added = heads if by_head else {f"L{layer} {'cross-attention' if cross else 'attention'}": sum(heads.values())}
    if attention.W_o.bias is not None:
        added["biases"] = attention.W_o.bias.double().expand_as(concat)
    return added


def _added(parts: dict, more: dict) -> dict:
    out = dict(parts)
    for name, p in more.items():
        out[name] = out[name] + p if name in out else p
    return out
