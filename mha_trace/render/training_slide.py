"""A training run's slide: the loss over the steps and each head's detector scores under it,
for `train --png` and for the run's view in Jupyter."""

from mha_trace.core.head import Head
from mha_trace.io.page import slide
from mha_trace.models.training import Training
from mha_trace.render.plots import (DPI, HEIGHT_PX, MIN_TICK_PT, TICK_PAD, WIDTH_PX, _png, _pyplot,
                                    _rc, _save, _theme, framed, heading, text_px)


@slide.register(Training)
def training_slide(r: Training, path: str, theme: str = "light", **_) -> None:
    """A training run on one slide, written to `path` (see training_png)."""
    _save(*training_figure(r, theme), path, _theme(theme)[1])


def training_png(r, theme: str = "light") -> bytes:
    """The training slide as PNG bytes (the notebook shows it under the run's tables)."""
    return _png(*training_figure(r, theme), _theme(theme)[1])


def training_figure(r, theme: str = "light") -> tuple:
    """(pyplot, the figure): the loss over the steps (every step's batch, and the held-out loss
    at the snapshots), and under it each head's detector scores at the snapshots."""
    plt = _pyplot()
    import numpy as np

    fg, bg = _theme(theme)
    steps = [s.step for s in r.snapshots]
    names = ("previous token", "induction")
    with plt.rc_context(_rc(fg)):
        name, values = text_px([], 20)[1], text_px(["0.00", f"{max(r.losses):.1f}"], MIN_TICK_PT)[0]
        fig, axes = plt.subplots(1 + len(names), 1, sharex=True, figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI),
                                 dpi=DPI, facecolor=bg, gridspec_kw=framed(
                                     16 + name + values + TICK_PAD, 32, heading(28),
                                     16 + name + text_px([], MIN_TICK_PT)[1] + TICK_PAD,
                                     rows=1 + len(names), gap=24, height_ratios=[2, 1, 1]))
        loss = axes[0]
        loss.plot(np.arange(len(r.losses)), r.losses, color="#888888", linewidth=1, label="each batch")
        loss.plot(steps, [s.loss for s in r.snapshots], "o-", color="#3b528b", linewidth=3,
                  markersize=8, label="held out, at the snapshots")
        loss.axhline(r.chance, color="#5ec962", linestyle="--", linewidth=2, label=f"chance (ln {r.spec.vocab})")
        loss.set_ylabel("loss (nats)", fontsize=20)
        loss.legend(fontsize=16, frameon=False, labelcolor=fg)
        colours = plt.get_cmap("tab10")  # the colour says the head, the line the layer
        for ax, name in zip(axes[1:], names):
            for l in range(r.spec.layers):
                for h in range(r.spec.heads):
                    ax.plot(steps, [s.scores[name][l, h] for s in r.snapshots], linewidth=2.5,
                            color=colours(h % 10), label=Head.at(l, h).name,
                            linestyle=("-", "--", ":", "-.")[l % 4])
            ax.set_ylim(0, 1)
            ax.set_ylabel(name, fontsize=20)
        axes[1].legend(fontsize=14, frameon=False, ncols=min(8, r.spec.layers * r.spec.heads),
                       labelcolor=fg, loc="upper left")
        axes[-1].set_xlabel("step", fontsize=20)
        axes[-1].set_xlim(0, len(r.losses))  # linear: each step gets the same width
        for ax in axes:
            ax.set_facecolor(bg)
            ax.tick_params(labelsize=MIN_TICK_PT)
            ax.grid(alpha=0.3)
        layers = f"{r.spec.layers} layer{'s' if r.spec.layers > 1 else ''}"
        fig.suptitle(f"{r.spec.task}: {layers} × {r.spec.heads} heads, the loss and what each head "
                     f"does", fontsize=28, color=fg)
    return plt, fig
