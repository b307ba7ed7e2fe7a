"""What a person sees on a slide, measured: the layout check itself finds labels over each other,
text at the slide's edge and a title wider than its panel; and the slides whose marks grow with
the case are drawn at their largest real case (SmolLM2's 270 heads, a row of 1,024 tiles)."""

import matplotlib
import numpy as np
import pytest
from slides import EDGE, laid_out

matplotlib.use("Agg")


def figure():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(19.2, 10.8), dpi=100)
    fig.subplots_adjust(left=0.2, right=0.8, top=0.8, bottom=0.2)
    return plt, fig, ax


def test_the_layout_check_finds_what_a_person_sees():
    plt, fig, ax = figure()
    ax.set_title("a title")
    laid_out(fig)  # the plain case passes
    ax.annotate("30.1 -0.28", (0.5, 0.5), fontsize=14)
    ax.annotate("30.2 +0.33", (0.505, 0.505), fontsize=14)  # a neighbour's name over it
    with pytest.raises(AssertionError):
        laid_out(fig)
    plt.close(fig)
    plt, fig, ax = figure()
    fig.text(1 - 2 / 1920, 0.5, "cut", ha="left")  # running off the slide's right edge
    with pytest.raises(AssertionError, match="edge"):
        laid_out(fig)
    plt.close(fig)
    plt, fig, ax = figure()
    ax.set_title("o ÷ ℓ so far; dashed: the row's final output, written out in full " * 3)
    with pytest.raises(AssertionError, match="wider than its panel"):
        laid_out(fig)
    plt.close(fig)


def test_a_title_of_wide_letters_is_cut_to_the_slides_width():
    from mha_trace.render.plots import WIDTH_PX, _fitted, text_px

    for text in ["W" * 200, "—" * 120, "The cat sat on the mat. " * 8]:
        fitted = _fitted(text, 95, 26)
        assert text_px([fitted], 26)[0] <= WIDTH_PX - 2 * EDGE and fitted.endswith("…")
    assert _fitted("Whisper tiny.en hears \"The cat\"", 95, 26) == "Whisper tiny.en hears \"The cat\""


def smollm2_patch(heads: np.ndarray):
    """A patch record of SmolLM2's shape (30 layers × 9 heads, 14 positions) with these head
    values; the corrupted run at 0 and the clean at 1, so each value is its own share."""
    from mha_trace.analyses.patching import Patching
    from mha_trace.models.base import Capabilities, ModelCard

    card = ModelCard("SmolLM2-135M-Instruct", "smollm2", 30, 9, 3, 576,
                     Capabilities(True, True, True, True, True, False))
    tokens = tuple(f"t{i}" for i in range(14))
    return Patching(card, tokens, tokens[:-1] + ("u",), "logit(Mary) − logit(John)", False, 1.0, 0.0,
                    np.zeros((30, 14)), heads, heads * 0.9)


@pytest.mark.parametrize("ringed", [[(29, 0), (29, 1), (28, 0)],  # a corner: three neighbours
                                    [(0, 8), (0, 7), (1, 8)], [(15, 4), (15, 5), (14, 4)]])
def test_the_patch_slide_names_270_heads_neighbouring_rings_apart(kept_slides, ringed):
    """Three neighbouring heads ringed (once "30.1 -0.28" written under "+0.33"): each named, with
    its share, no name over another nor off its panel."""
    from mha_trace.io.page import slide
    from mha_trace.render import patching, patching_slide  # noqa: F401 (registers the slide)

    heads = np.zeros((30, 9))
    for value, (layer, head) in zip((-0.28, 0.33, 0.31), ringed):
        heads[layer, head] = value
    made = kept_slides(patching_slide)
    slide(smollm2_patch(heads), "p.png", theme="dark")
    laid_out(made[-1])
    names = sorted(t.get_text() for t in made[-1].axes[1].texts)
    assert names == sorted(f"{layer + 1}.{head + 1} {value:+.2f}" for value, (layer, head)
                           in zip((-0.28, 0.33, 0.31), ringed))


def test_the_tiled_slide_at_1024_tiles_names_a_few_keys_and_tiles(kept_slides, tmp_path):
    """A row of 1,024 keys, a tile each (the most a trace walks): the keys and tiles named every
    k-th, the m, rescale and ℓ values drawn and not written (each tile's over its neighbour's)."""
    import mha_trace
    from mha_trace.io.page import slide
    from mha_trace.render import tiled_slide, tiled_walk  # noqa: F401 (registers the slide)

    config = tmp_path / "long.toml"
    words = " ".join(f"w{i}" for i in range(1024))
    config.write_text(f'title = "a long row"\nsentence = "{words}"\nd_model = 8\nheads = 2\nseed = 1\n')
    walk = mha_trace.explain(str(config), token="w1023", impl="tiled", block_k=1)
    assert len(walk.heads[0].tiles) == 1024
    made = kept_slides(tiled_slide)
    slide(walk, "t.png", theme="dark")
    laid_out(made[-1])
    scores, sums, outputs = made[-1].axes[:3]
    assert len(scores.get_xticklabels()) <= tiled_slide.KEYS_NAMED
    assert len(sums.get_xticklabels()) <= tiled_slide.TILES_NAMED and len(sums.texts) == 0
    assert len(scores.texts) == 0
