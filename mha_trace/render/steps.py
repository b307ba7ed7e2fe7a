"""What every table of a traced run shares: its title (the run, its sizes and options) and its
code cut to one line of the width left."""

from mha_trace.errors import printable
from mha_trace.analyses.shapes import ShapesReport


def title(report: ShapesReport) -> str:
    r, run = report.sizes, report.run
    kv = f" kv_heads={r.kv_heads}" if r.kv_heads and r.kv_heads != r.heads else ""
    mask = f" mask={r.mask}" if r.mask != "none" else ""
    pad = f" pad={r.pad}" if r.pad else ""
    who = f"{run.label}, {run.call}: " if run.label else ""
    if run.config is not None and run.sentence is None:  # a model run names its sentence itself
        who += f"the config \"{printable(run.config.title)}\", "
    extra = "".join([r.rope_setting(), f" window={r.window}" if r.window else "",
                     f" impl={r.impl}" if r.impl != "explicit" else "",
                     f" decode={r.decode}" if r.decode else "",
                     r.scoring.settings(),
                     f" latent={r.latent}{' absorbed' * r.absorbed}" if r.latent else ""])
    d_k = f" (d_k={r.d_model // r.heads})" if r.d_model % r.heads == 0 else ""
    return (f"shapes: {who}batch={r.batch} seq={r.seq} d_model={r.d_model} heads={r.heads}{kv}"
            f"{d_k}{mask}{pad}{extra} {r.dtype} on {r.device}")


def elide(text: str, width: int) -> str:
    """Text on one line of at most `width`: when longer, its middle gives way to "…" (the call's
    start and its arguments' end stay)."""
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    head = max(1, (width - 1) * 2 // 3)
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]
