"""The run of a model that hears (Whisper): a decoder layer's cross-attention while it writes what it
heard, the audio's keys and values projected once into a StaticKVCache and read back at every step;
with --attention encoder, an encoder layer's self-attention over the 1,500 frames."""

from mha_trace.models.base import AudioModel
from mha_trace.core.attention import StaticKVCache
from mha_trace.runs.model_options import check_layer, refuse_with_model
from mha_trace.runs.run import Run, Sizes, _source

STEPS = 3  # decoding steps a trace of the cross-attention shows


def hearing_run(o, model: AudioModel) -> Run:
    """`shapes --model whisper --audio FILE [--layer N]`: the prompt's queries meet the audio
    frames' keys and values, projected once into the cache; then each written token's query meets
    them again, read from the cache (nothing projected: the audio handed is empty)."""
    refuse_with_model(sentence=o.sentence, decode=o.decode or None)
    layer = check_layer(model, 1 if o.layer is None else o.layer)
    if o.attention == "encoder":
        return _encoder_run(model, model.heard_file(o.audio).samples, layer)
    import torch

    heard = model.heard_file(o.audio)
    frames = torch.from_numpy(heard.encoded)[None].to(model.device)  # (1, 1500, D): encoded once
    module = model.decoder.blocks[layer - 1].cross
    seen = []
    hook = module.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    try:
        model.decode(heard.ids, frames)
    finally:
        hook.remove()
    x, prompt = seen[0], heard.prompt  # (1, T, D): what the cross-attention's queries read
    steps = min(STEPS, len(heard.ids) - prompt)
    sizes = Sizes(batch=1, seq=prompt, d_model=model.d_model, heads=model.heads,
                  device=model.device.type, decode=steps, cross=frames.size(1))
    cache, none = StaticKVCache(), frames[:, :0]  # (1, 0, D): no new audio after the first step
    phases = [("prefill", (x[:, :prompt], frames, frames), {"cache": cache})] + [
        (f"decode step {i + 1}", (x[:, prompt + i:prompt + i + 1], none, none), {"cache": cache})
        for i in range(steps)]
    return Run(module, (x[:, :prompt], frames, frames), {}, sizes,
               label=f"{model.name} decoder layer {layer} cross-attention",
               call="forward(text, audio, audio, cache), then forward(token, none, none, cache) per token",
               tokens=heard.tokens[:prompt + steps], x=x, source=_source(module), phases=phases,
               layer=layer)


def _encoder_run(model: AudioModel, samples, layer: int) -> Run:
    """`shapes --model whisper --audio FILE --attention encoder [--layer N]`: every frame's query
    meets every frame's key, 1,500 × 1,500 a head, no mask."""
    import torch


    block = model.encoder.blocks[layer - 1]
    x = model.encoder_attention_input(samples, layer)  # (1, 1500, D): the frames, normed
    sizes = Sizes(batch=1, seq=x.size(1), d_model=model.d_model, heads=model.heads, device=model.device.type)
    with torch.no_grad():
        return Run(block.attention, (x, x, x), {}, sizes, label=f"{model.name} encoder layer {layer} self-attention",
                   call="forward(frames, frames, frames)", x=x, source=_source(block.attention), layer=layer)
