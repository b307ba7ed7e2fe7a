"""Whisper's alignment slide (`survey --model whisper --audio FILE --png`): the sound's loudness
over time; below it the published heads' alignment (text tokens down, time across) with the path
Whisper's timings read off it; beside them every cross-attention head's disagreement, the lag of
the half that agree most, the published heads boxed."""

import numpy as np

from mha_trace.analyses.alignment import FRAMES_PER_SECOND, Hearing
from mha_trace.core.head import Head
from mha_trace.io.page import slide
from mha_trace.render.plots import DPI, HEIGHT_PX, MIN_TICK_PT, WIDTH_PX, _fitted, _pyplot, _rc, _save, _theme


@slide.register(Hearing)
def alignment_slide(h: Hearing, path: str, theme: str = "light", **_) -> None:
    plt = _pyplot()
    fg, bg = _theme(theme)
    rows = h.matrix[:len(h.tokens)]
    seconds = rows.shape[1] / FRAMES_PER_SECOND
    with plt.rc_context({**_rc(fg), "axes.facecolor": bg, "xtick.labelsize": MIN_TICK_PT,
                         "ytick.labelsize": MIN_TICK_PT}):
        fig = plt.figure(figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI), dpi=DPI, facecolor=bg)
        grid = fig.add_gridspec(2, 2, width_ratios=[5, 2], height_ratios=[1, 4], left=0.09,
                                right=0.97, top=0.82, bottom=0.08, wspace=0.18, hspace=0.06)
        sound, picture, heads = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[:, 1])
        t = (np.arange(len(h.loudness)) + 0.5) / FRAMES_PER_SECOND
        sound.fill_between(t, -h.loudness, h.loudness, color="#21918c", linewidth=0)
        sound.set_xlim(0, seconds)
        sound.set_xticks([])
        sound.set_yticks([])
        sound.set_ylabel("sound", fontsize=MIN_TICK_PT)
        picture.imshow(rows, aspect="auto", cmap="magma", extent=(0, seconds, len(rows) - 0.5, -0.5),
                       interpolation="nearest")
        r, c = h.path
        shown = r < len(rows)
        picture.plot((c[shown] + 0.5) / FRAMES_PER_SECOND, r[shown], color="#4fc3f7", linewidth=2.5)
        picture.set_yticks(range(len(rows)), [tok.strip() or repr(tok) for tok in h.tokens])
        picture.set_xlabel("time (s)")
        for w in h.words or []:
            for ax in (sound, picture):
                ax.axvline(w.start, color="#888888", linewidth=1, linestyle=":")
        L, H = h.disagreement.shape
        image = heads.imshow(h.disagreement, cmap="viridis_r", aspect="auto")
        for layer, head in np.ndindex(L, H):
            value = h.disagreement[layer, head]
            ringed = (layer + 1, head + 1) in h.published
            lag = f"\n{h.lag[layer, head]:+.2f}" if Head.at(layer, head) in h.following else ""
            heads.text(head, layer, f"{value:.2f}{lag}", ha="center", va="center", fontsize=MIN_TICK_PT,
                       color="white" if value > np.median(h.disagreement) else "black",
                       fontweight="bold" if ringed else "normal")
            if ringed:
                heads.add_patch(plt.Rectangle((head - 0.45, layer - 0.45), 0.9, 0.9, fill=False,
                                              edgecolor="#e91e63", linewidth=4))
        heads.set_xticks(range(H), [str(i + 1) for i in range(H)])
        heads.set_yticks(range(L), [str(i + 1) for i in range(L)])
        heads.set_xlabel("head")
        heads.set_ylabel("decoder layer")
        heads.set_title(f"disagreement (s), and under it\nthe lag of the {h.disagreement.size // 2} that agree "
                        f"most;\nboxed: published; of the 8 latest,\n{h.precision} published "
                        f"(chance {h.chance:.1f})", fontsize=16, color=fg)
        fig.colorbar(image, ax=heads, orientation="horizontal", fraction=0.05, pad=0.1).ax.tick_params(labelsize=MIN_TICK_PT)
        sound.set_title("where each token listens (the published heads) and the timings' path",
                        fontsize=18, color=fg)
        fig.suptitle(_fitted(f"{h.card.name} hears \"{h.text}\"", 95, 26), fontsize=26, color=fg)
    _save(plt, fig, path, bg)
