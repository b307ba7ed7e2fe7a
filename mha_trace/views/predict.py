"""The predict view (`mha-trace predict`, `Model.predict`): a causal model's next-token
distribution, and a greedy continuation."""

from dataclasses import dataclass, field

from mha_trace.runs.resolve import RunOptions


@dataclass(frozen=True)
class PredictRequest:
    source: RunOptions = field(default_factory=lambda: RunOptions(model="smollm2"))
    text: str = "The capital of France is"
    top: int = 10
    generate: int = 0


def predict_view(r: PredictRequest, bar=None):
    """The Prediction; `bar(total, what)` the progress bar of the generated tokens."""
    from mha_trace.analyses.model_analysis import predict
    from mha_trace.runs.resolve import check_options, load, with_checkpoint
    from mha_trace.runs.values import text_of, whole_numbers
    from mha_trace.views.source import no_bar

    o = with_checkpoint(r.source)
    check_options(o)
    text, top = text_of(r.text), whole_numbers([r.top], "top")[0]
    generate = whole_numbers([r.generate], "generate", least=0)[0]
    import mha_trace.render.model  # noqa: F401 (the renderers of what it returns)
    m = load(o)
    with (bar or no_bar)(generate, "generating (one pass of the model per token)") as advance:
        return predict(m, text, top, generate, advance)
