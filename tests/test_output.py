"""The output layer: terminals (a real pty), pipes, SVG/HTML/PNG files, determinism, completion."""

import io
import os
import pty
import json
import re
import select
import subprocess
import sys

import numpy as np
import pytest
from slides import laid_out

COLOUR = re.compile(r"\x1b\[[0-9;]*(3[0-9]|4[0-9]|38;|48;)[0-9;]*m")
ANY_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def in_pty(*args, env_extra=None) -> str:
    """Run the installed command in a real pseudo-terminal of 100 columns; return what it drew."""
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "100", "LINES": "50",
           **(env_extra or {})}
    env.pop("NO_COLOR", None) if "NO_COLOR" not in (env_extra or {}) else None
    parent, child = pty.openpty()
    proc = subprocess.Popen(["mha-trace", *args], stdin=child, stdout=child, stderr=child, env=env,
                            close_fds=True)
    os.close(child)
    chunks = []
    while True:
        ready, _, _ = select.select([parent], [], [], 60)
        if not ready:
            break
        try:
            data = os.read(parent, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(parent)
    return b"".join(chunks).decode("utf-8", "replace")


@pytest.mark.slow
def test_colour_on_a_terminal_and_not_with_no_color():
    coloured = in_pty("shapes")
    assert COLOUR.search(coloured), "no colour codes on a terminal"
    lines = ANY_ESCAPE.sub("", coloured).replace("\r", "").splitlines()
    assert any("contiguous" in line for line in lines)
    assert max(len(line) for line in lines) <= 100, "the default table fits 100 columns"
    plain = in_pty("shapes", env_extra={"NO_COLOR": "1"})
    assert not COLOUR.search(plain)
    assert "shapes: batch=2 seq=10" in plain


@pytest.mark.slow
def test_no_color_flag_on_a_terminal():
    assert not COLOUR.search(in_pty("heads", "--no-color"))


EVERY_COMMAND = [
    ("shapes",), ("shapes", "--device", "meta", "--seq", "64", "--mask", "causal"),
    ("heads",), ("heads", "--config", "chicken-road"), ("explain", "--token", "cat"),
    ("compare",), ("ablate",), ("configs",), ("cost", "--preset", "mistral-7b"), ("verify",),
]


@pytest.mark.parametrize("args", EVERY_COMMAND, ids=" ".join)
def test_same_command_twice_prints_the_same_bytes(cli, args):
    for fmt in ("table", "json"):
        first, second = cli(*args, "--format", fmt), cli(*args, "--format", fmt)
        assert first.exit_code == 0, first.stderr
        assert first.stdout == second.stdout and first.stdout


def test_svg_and_html_hold_what_was_printed(cli, tmp_path):
    svg, html = tmp_path / "s.svg", tmp_path / "s.html"
    result = cli("shapes", "--svg", str(svg), "--html", str(html))
    assert result.exit_code == 0
    picture = svg.read_text()
    assert picture.startswith("<svg") and ">mha-trace&#160;shapes<" in picture
    text = html.read_text()
    for fragment in ("self.W_q(q)", "contiguous", "[2, 8, 10, 10]", "attention.py"):
        assert fragment in text
    json_svg = tmp_path / "j.svg"
    assert cli("cost", "--format", "json", "--svg", str(json_svg)).exit_code == 0
    assert "schema_version" in json_svg.read_text()


def test_unwritable_svg_path_is_one_line(cli, tmp_path):
    result = cli("configs", "--svg", str(tmp_path / "missing" / "x.svg"))
    assert result.exit_code == 2
    assert result.stderr == (f"Error: --svg: {tmp_path / 'missing' / 'x.svg'}: the folder "
                             f"{tmp_path / 'missing'} does not exist\n")


@pytest.mark.parametrize("args", [("heads",), ("explain", "--token", "cat", "--mask", "causal"),
                                  ("compare", "--heads", "1,2")], ids=" ".join)
def test_png_heatmaps(cli, tmp_path, args):
    png = tmp_path / "out.png"
    result = cli(*args, "--png", str(png))
    assert result.exit_code == 0, result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


@pytest.mark.parametrize("theme,background", [("light", (255, 255, 255)), ("dark", (30, 30, 30))])
def test_png_is_slide_sized_with_a_colour_bar(cli, tmp_path, theme, background):
    from PIL import Image

    png = tmp_path / "h.png"
    assert cli("heads", "--config", "chicken-road", "--png", str(png), "--theme", theme).exit_code == 0
    image = Image.open(png).convert("RGB")
    assert image.size == (1920, 1080)
    assert image.getpixel((5, 5)) == background
    # the colour bar: a vertical strip near the right edge running through the viridis ramp
    bar = [image.getpixel((x, y)) for x in range(1700, 1900, 4) for y in range(200, 900, 50)]
    ramp = {p for p in bar if p != background and max(p) - min(p) > 60}
    assert len(ramp) >= 8


@pytest.mark.parametrize("args", [
    ("heads", "--config", "chicken-road", "--head", "1"), ("explain", "--token", "cat"),
    ("compare", "--heads", "1,2,4"), ("heads", "--config", "chicken-road", "--kv-heads", "2"),
    ("explain", "--model", "minilm", "--token", "it"),
], ids=" ".join)
def test_every_png_is_one_slide(cli, tmp_path, args):
    from PIL import Image

    png = tmp_path / "slide.png"
    result = cli(*args, "--png", str(png), "--theme", "light")
    assert result.exit_code == 0, result.stderr
    assert Image.open(png).size == (1920, 1080)


def _figures(kept_slides):
    """The figures save_heatmaps and save_walk make, kept instead of written."""
    from mha_trace.render import heatmaps, walk_slide

    return kept_slides(heatmaps, walk_slide)


def test_heatmaps_scale_from_zero_fill_the_slide_and_label_readably(kept_slides):
    """The darkest colour is no attention: the scale runs from 0 to the slide's largest weight
    (or 1 with --scale 1); 9 heads are 2 × 5 (one slot empty) and 12 are 3 rows of 4; every label is at least
    18 px (13 pt at 100 dpi); a leading space is drawn as ␣ (as every medium shows it); K/V sharing is named."""
    from mha_trace.render import heatmaps

    made = _figures(kept_slides)
    tokens = ["␣The", "␣cat", "␣sat"] * 10
    m = np.full((30, 30), 1 / 30) + np.eye(30) * 0.2
    heatmaps.save_heatmaps("x.png", "t", [("h", tokens, tokens, m, None)] * 9)
    heatmaps.save_heatmaps("x.png", "t", [("h", tokens, tokens, m, None)] * 12, top=1.0)
    heatmaps.save_heatmaps("x.png", "t", [("h", tokens[:4], tokens[:4], m[:4, :4], None)] * 4,
                        groups=[0, 0, 1, 1])
    nine, twelve, shared = made
    for fig in made:
        assert tuple(fig.get_size_inches() * fig.dpi) == (1920, 1080)
        for ax in [a for a in fig.axes[:-1] if a.axison]:  # the empty slot aside
            for label in ax.get_xticklabels() + ax.get_yticklabels():
                assert label.get_fontsize() >= 13 and label.get_text().startswith("␣")
    image = nine.axes[0].images[0]
    assert image.norm.vmin == 0 and image.norm.vmax == pytest.approx(m.max())
    assert twelve.axes[0].images[0].norm.vmax == 1.0
    assert nine.axes[0].get_subplotspec().get_gridspec().get_geometry() == (2, 5)
    assert twelve.axes[0].get_subplotspec().get_gridspec().get_geometry() == (3, 4)
    keys = [t.get_text() for t in nine.axes[5].get_xticklabels()]  # the bottom row names the keys
    assert len(keys) >= 10 and set(keys) <= set(tokens)  # every k-th of 30, never shrunk
    assert [ax.get_title() for ax in shared.axes[:4]] == [f"h · K/V head {g}" for g in (1, 1, 2, 2)]


def test_masked_cells_are_hatched_grey_and_the_others_coloured(cli, kept_slides):
    """What a causal slide shows: a masked key's cell is grey hatching on the background, never
    a colour of the scale; a seen key's cell is its weight's colour throughout."""
    made = _figures(kept_slides)
    assert cli("heads", "--mask", "causal", "--head", "1", "--png", "x.png", "--theme", "light").exit_code == 0
    (fig,) = made
    fig.canvas.draw()
    pixels = np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(int)
    ax = fig.axes[0]

    def cell(i, j, top=-0.3, bottom=0.3):  # the colours of cell (i, j), its middle 60% across
        (x0, x1), (y0, y1) = np.sort(np.round(ax.transData.transform(
            [(j - 0.3, i + top), (j + 0.3, i + bottom)])).astype(int).T)
        return {tuple(p) for p in pixels[1080 - y1:1080 - y0, x0:x1].reshape(-1, 3)}

    masked, seen = cell(0, 4), cell(4, 0, -0.45, -0.3)  # above the weight written in it
    assert all(max(p) - min(p) < 8 for p in masked)  # greys only: no colour of the scale
    assert min(map(min, masked)) < 160 and (255, 255, 255) in masked  # the hatching's lines on white
    assert len(seen) == 1 and max(next(iter(seen))) - min(next(iter(seen))) > 40  # one viridis colour


_LONG = ["The", "internationalization", "of", "attention", "mechanisms", "is", "bewildering", "."]
_CAT, _ROAD = "The cat sat on mat".split(), "The chicken didn't cross the road because it was too wide.".split()


@pytest.mark.parametrize("panels", [
    [("head 1", _LONG, _LONG, np.full((8, 8), 1 / 8), None)],
    [("h", ["␣The", "␣cat", "␣sat"] * 10, ["␣The", "␣cat", "␣sat"] * 10, np.eye(30), None)] * 9,
    [("h", list("abcdefghijklmno"), list("abcdefghijklmno"), np.eye(15), None)] * 12,
    [("cat", _CAT, _CAT, np.eye(5), None), ("road", _ROAD, _ROAD, np.eye(11), None)] * 2,
    [("h", ["x" * 200, "b"], ["x" * 200, "b"], np.eye(2), None)] * 4,  # a config's token, cut
], ids=["one", "nine", "twelve", "two sentences", "a 200-character token"])
def test_heatmap_slides_are_laid_out_without_overlap_and_fill_the_slide(kept_slides, panels):
    """The fixed layout, drawn and measured: every text on the slide, no panel, colour bar or
    label over another panel's, and the grid as wide or as tall as the slide allows. Panels of
    two sentences (last) each carry their own labels, so the gaps make room for them."""
    from mha_trace.render import heatmaps

    made = _figures(kept_slides)
    heatmaps.save_heatmaps("x.png", "a title", panels)
    (fig,) = made
    extent = laid_out(fig)
    assert max((extent[:, 2].max() - extent[:, 0].min()) / 1920,
               (extent[:, 3].max() - extent[:, 1].min()) / 1080) > 0.9


@pytest.mark.parametrize("args", [
    ("explain", "--token", "cat"), ("explain", "--config", "chicken-road", "--heads", "16", "--token", "it"),
    ("explain", "--config", "chicken-road", "--token", "it", "--why"),
    ("explain", "--model", "minilm", "--token", "it", "--layer", "6", "--why"),
    ("explain", "--config", "animal-street", "--token", "it", "--impl", "tiled"),
    ("explain", "--config", "chicken-road", "--rope", "--heads", "4", "--token", "it", "--rope-planes"),
], ids=["walk, 2 heads", "walk, 16 heads", "why, 8 heads", "why, MiniLM's 12", "tiles, 4 heads",
        "RoPE planes, 4 heads"])
def test_slides_of_a_row_per_head_are_laid_out_without_overlap(cli, kept_slides, args):
    """The walk's, the why's, the tiles' and the RoPE planes' slides, placed from what they hold
    (no constrained layout): every text on the slide and clear of the others (a zero score written once, the
    running max's name over its tile, each legend over what it names)."""
    from mha_trace.render import rope_slide, tiled_slide, walk_slide, why_slide

    made = kept_slides(walk_slide, why_slide, tiled_slide, rope_slide)
    assert cli(*args, "--png", "x.png").exit_code == 0
    (fig,) = made
    laid_out(fig)


def test_the_explain_slide_shows_each_heads_scores_scaled_scores_weights_and_output(cli, kept_slides):
    made = _figures(kept_slides)
    data = json.loads(cli("explain", "--token", "cat", "--format", "json").stdout)
    assert cli("explain", "--token", "cat", "--png", "x.png").exit_code == 0
    (fig,) = made
    axes = np.array(fig.axes).reshape(-1, 3)
    assert len(axes) == len(data["heads"])
    for row, head in zip(axes, data["heads"]):
        dots, scaled = _bars(row[0])[:2]
        assert dots == pytest.approx([k["dot"] for k in head["keys"]])
        assert scaled == pytest.approx([k["scaled"] for k in head["keys"]])
        assert _bars(row[1])[0] == pytest.approx([k["weight"] for k in head["keys"]])
        assert _bars(row[2])[0] == pytest.approx(head["output"])


def _bars(ax) -> list:
    """Each set of bars drawn on `ax` (one collection each): their heights, left to right."""
    sets = []
    for drawn in ax.collections:
        corners = sorted((p.vertices[0, 0], p.vertices[1, 1] - p.vertices[0, 1]) for p in drawn.get_paths())
        sets.append([height for _, height in corners])
    return sets


def test_scale_goes_with_png_and_is_a_weight(cli):
    assert cli("heads", "--scale", "1").stderr.startswith("Error: --scale")
    assert cli("heads", "--scale", "0", "--png", "x.png").stderr.startswith("Error: --scale")


def test_svg_theme_light_for_slides(cli, tmp_path):
    light, dark = tmp_path / "l.svg", tmp_path / "d.svg"
    cli("configs", "--svg", str(light), "--theme", "light")
    cli("configs", "--svg", str(dark))
    assert "#ffffff" in light.read_text().lower() and "#ffffff" not in dark.read_text().lower()[:3000]


@pytest.mark.slow
def test_png_without_matplotlib_says_how_to_install(tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = None; from typer.testing import CliRunner; "
            "from mha_trace.cli import app; "
            f"r = CliRunner().invoke(app, ['heads', '--png', {str(tmp_path / 'x.png')!r}]); "
            "print(r.exit_code); print(r.stderr, end='')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout == ('1\nError: --png needs matplotlib (install it with: pip install '
                          'matplotlib, or from a clone: pip install ".[plot]")\n')


def test_markdown_everywhere(cli):
    for args in EVERY_COMMAND:
        out = cli(*args, "--format", "markdown").stdout
        assert "|---" in out and "\x1b" not in out, args


@pytest.mark.slow
def test_shell_completion_completes_commands():
    env = {**os.environ, "_MHA_TRACE_COMPLETE": "complete_bash", "COMP_WORDS": "mha-trace co",
           "COMP_CWORD": "1"}
    out = subprocess.run(["mha-trace"], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.split() == ["compare", "configs", "cost"]


@pytest.mark.parametrize("tokens,rows,masked", [
    (["The", "cat", "sat", "on", "mat"], None, False),
    (["▁internationalization", "猫", "日本語", ":smiley_cat:", "[CLS]", "a"], None, True),
    (["x"], ["a very long query label", "y"], False),
], ids=["ascii", "wide, emoji codes, markup", "one key"])
def test_a_weight_tables_counted_width_is_what_rich_measures_and_prints(tokens, rows, masked):
    """Each layout's width is counted, not measured through rich: the count must be rich's own
    measurement of the same table and the width of its longest printed line, on the console the
    views print to (no markup, no emoji codes: ':smiley_cat:' is 12 columns, 猫 two)."""
    from rich.cells import cell_len
    from rich.measure import Measurement

    from mha_trace.io.output import Output, make_console
    from mha_trace.render.matrices import weights_table

    rng = np.random.default_rng(3)
    weights = rng.dirichlet(np.ones(len(tokens)), size=len(rows or tokens))
    mask = np.tril(np.ones(weights.shape, bool)) if masked else None
    table = weights_table("t", tokens, weights, mask, 4, rows)
    for layout in table.layouts():
        console = make_console(Output(no_color=True, width=1000), io.StringIO())
        drawn = table.table(layout=layout)
        with console.capture() as captured:
            console.print(drawn)
        printed = max(cell_len(line) for line in captured.get().splitlines())
        assert table.width(layout) == printed == Measurement.get(console, console.options, drawn).maximum


def test_wide_weight_tables_fit_by_fewer_decimals_then_short_labels_then_split(cli):
    """chicken-road's 11 keys: 4 decimals at 106 columns, 3 at 100, 2 without leading zeros and
    with short key labels (named below) at 80, and only at 60 split into tables of keys; no
    number is ever cut short, and the weights shown are the JSON's, rounded."""
    args = ("heads", "--config", "chicken-road", "--head", "1", "--width")
    weights = json.loads(cli(*args[:-1], "--format", "json").stdout)["heads"][0]["weights"]
    wide, hundred, eighty, sixty = (cli(*args, str(w)).stdout for w in (106, 100, 80, 60))
    assert f"{weights[0][0]:.4f}" in wide and "decimals to fit" not in wide
    assert f"{weights[0][0]:.3f}" in hundred and "3 decimals to fit (--width 106 shows 4)" in hundred
    assert f"{weights[0][0]:.2f}"[1:] in eighty and "2 decimals to fit" in eighty
    assert "keys shortened: chi… chicken" in eighty and "keys 1–" not in eighty
    assert "keys 1–" in sixty and "(--width 106 shows them in one table)" in sixty
    for text, width in ((wide, 106), (hundred, 100), (eighty, 80), (sixty, 60)):
        assert max(len(line) for line in text.splitlines()) <= width
        assert not re.search(r"\d…", text)  # no number is cut short


@pytest.mark.slow
def test_shading_is_distinct_and_spans_a_visible_range():
    """In a real terminal, chicken-road's weights (0.03 to 0.3) are shaded per matrix: several
    distinct colours from dark to light, not three near-black ones."""
    drawn = in_pty("heads", "--config", "chicken-road", "--head", "1", env_extra={"COLORTERM": "truecolor"})
    colours = {tuple(map(int, m)) for m in re.findall(r"48;2;(\d+);(\d+);(\d+)", drawn)}
    luminance = sorted(0.299 * r + 0.587 * g + 0.114 * b for r, g, b in colours)
    assert len(colours) >= 6
    assert luminance[-1] - luminance[0] > 150  # from the darkest stop to the brightest
    assert 30 < luminance[0] and luminance[-1] < 250  # visible on black and on white


def test_model_overview_lays_many_layers_across_and_leaves_masked_cells_empty(tmp_path):
    from PIL import Image

    from mha_trace.render.heatmaps import save_overview

    T = 8
    causal = np.tril(np.ones((T, T), bool))
    w = np.where(causal, 1.0, 0.0)  # every visible cell at the top of the ramp
    w = np.broadcast_to(w / w.sum(-1, keepdims=True), (30, 2, T, T))
    save_overview(str(tmp_path / "o.png"), "model", w, causal, "light")
    image = np.asarray(Image.open(tmp_path / "o.png").convert("RGB"), int)
    assert image.shape == (1080, 1920, 3)
    painted = (image != 255).any(axis=2)[:, :1760]  # left of the colour bar
    yellow = (image[..., 0] > 200) & (image[..., 1] > 200) & (image[..., 2] < 100)
    runs = lambda row: int((row[1:] & ~row[:-1]).sum())
    # 30 layers across: the first query's line (weight 1 on its own key) crosses 30 yellow tiles
    top = next(y for y in range(1080) if runs(yellow[y, :1760]) == 30)
    # the masked upper triangle is left as background: on that line only the first key of each
    # tile is painted; the last query sees every key, so its line is painted all across the tile
    left = int(np.argmax(yellow[top])) - 2  # the tiles' left edge; the row labels lie left of it
    painted = painted[:, left:]
    bottom = next(y for y in range(top, 1080) if runs(painted[y]) != 30) - 2
    assert bottom - top > 100 and painted[bottom].sum() > 6 * painted[top].sum()


@pytest.mark.slow
def test_generating_shows_a_progress_bar_on_a_terminal_and_none_when_piped(cli):
    """predict --generate runs the whole model once per token: a bar on a terminal's stderr
    (gone when done), nothing when piped."""
    drawn = in_pty("predict", "--generate", "2", "--top", "2")
    assert "generating (one pass of the model per token)" in drawn and "2/2" in drawn
    assert "Greedy, 2 tokens:" in drawn
    piped = cli("predict", "--generate", "2", "--top", "2")
    assert piped.exit_code == 0 and piped.stderr == "" and "Greedy, 2 tokens:" in piped.stdout


@pytest.mark.slow
def test_training_shows_its_loss_in_the_bar_and_says_up_front_when_it_is_long(cli, monkeypatch):
    drawn = in_pty("train", "--task", "previous-token", "--steps", "60")
    assert "training (previous-token), loss " in drawn and "60/60" in drawn
    from mha_trace.models import training

    real = training.run_training  # a long run is announced, then (here, a short stand-in) runs
    monkeypatch.setattr(training, "run_training", lambda spec, *a: real(
        training.Spec.of("previous-token", steps=2, snapshots=2)))
    long = cli("train", "--steps", "20000", "--format", "json")
    minutes = training.Spec.of("induction", steps=20000).seconds / 60
    assert long.stderr == f"This run takes about {minutes:.0f} minutes on 2 cores.\n" and minutes > 5


@pytest.mark.parametrize("args", [("shapes",), ("heads",), ("explain", "--token", "cat"),
                                  ("cost", "--preset", "gpt2-small"), ("heads", "--model", "minilm")])
def test_json_is_what_the_standard_encoder_makes_with_rows_on_one_line(cli, args):
    """The same document as json.dumps(indent=2) would give; only a list holding no list or
    object is written on one line (a weights row, a shape, the tokens)."""
    import json

    text = cli(*args, "--format", "json").stdout
    data = json.loads(text)
    assert json.loads(json.dumps(data, indent=2)) == data
    lines = text.splitlines()
    flat = [line for line in lines if line.strip().startswith("[") and line.rstrip(",").endswith("]")]
    rows = [json.loads(line.strip().rstrip(",")) for line in flat]
    assert all(not any(isinstance(v, (list, dict)) for v in row) for row in rows)
    assert len(lines) <= len(json.dumps(data, indent=2).splitlines())


def test_a_long_sentence_title_is_cut_to_fit_the_slide():
    from mha_trace.render.plots import _fitted

    long = "all-MiniLM-L6-v2: " + " ".join(["the cat sat on the mat"] * 10)
    assert len(_fitted(long, 95)) == 95 and _fitted(long, 95).endswith("…")
    assert _fitted("head 1.1", 95) == "head 1.1"


def test_sixteen_tokens_of_eight_letters_fit_one_table_at_100_columns(cli, tmp_path):
    config = tmp_path / "sixteen.toml"
    words = ("absolute balanced candidat daylight elephant fountain gardener hospital imported "
             "jumpsuit kangaroo landmark mountain notebook organism painting")
    config.write_text(f'title = "sixteen"\nsentence = "{words}"\nd_model = 16\nheads = 2\n')
    out = cli("heads", "--config", str(config), "--head", "1", "--width", "100").stdout
    assert "keys 1–" not in out and max(len(line) for line in out.splitlines()) <= 100
    rows = [line for line in out.splitlines() if line.split()[:1] and line.split()[0] in words.split()]
    assert len(rows) == 16 and all(len(r.split()) == 17 for r in rows)  # every key in one row


def test_every_file_written_is_announced_on_stderr(cli, tmp_path):
    """--html, --png, --svg and train --save each say what they wrote and its size, on stderr:
    stdout stays the data (or the text view)."""
    import os

    from mha_trace.io.units import human_bytes

    for option, name in (("--html", "page.html"), ("--png", "heads.png"), ("--svg", "heads.svg")):
        path = tmp_path / name
        result = cli("heads", option, str(path))
        assert result.exit_code == 0
        assert result.stderr == f"Wrote {path} ({human_bytes(os.path.getsize(path))})\n"
        assert "Wrote" not in result.stdout
    both = cli("heads", "--png", str(tmp_path / "a.png"), "--svg", str(tmp_path / "b.svg"),
               "--format", "json")
    assert both.stderr.startswith(f"Wrote {tmp_path / 'a.png'}, {tmp_path / 'b.svg'} (")
    assert both.stdout.lstrip().startswith("{")
    run = tmp_path / "run.pt"
    result = cli("train", "--task", "previous-token", "--steps", "2", "--snapshots", "2",
                 "--save", str(run))
    assert result.exit_code == 0 and f"Wrote {run} (" in result.stderr


def test_a_set_of_files_is_announced_in_one_line():
    from mha_trace.io.files import written_line

    files = [(f"h-layer{i}.png", 1024) for i in range(1, 31)]
    assert written_line(files) == "Wrote 30 files (30.0 KiB): h-layer1.png, h-layer2.png … h-layer30.png"


def test_the_pruning_slide_zooms_on_the_rises_and_counts_the_heads(kept_slides):
    """The whole curve, and beside it the part up to a 25% rise: each rise's line says how many
    heads go before the loss passes it (the last point under it before the first point over)."""
    from mha_trace.render import pruning_slide

    made = kept_slides(pruning_slide)
    points = [(0, 4.0), (10, 4.0), (20, 4.1), (30, 4.3), (40, 4.5), (100, 9.0)]
    pruning_slide.save_curve("p.png", "t", points, 100, 4.0, (0.05, 0.10))
    (fig,) = made
    whole, near = fig.axes
    assert whole.get_xlim() == (0, 100) and near.get_xlim() == (0, 100)  # nothing over +25% before 100
    assert near.get_ylim() == pytest.approx((3.88, 5.08))
    labels = [t.get_text().strip() for t in near.texts]
    assert labels == ["every head", "+5%: 20 heads go first", "+10%: 30 heads go first"]
    laid_out(fig)


def test_compare_packs_head_counts_into_rows_not_a_staircase(cli, tmp_path, kept_slides):
    """--heads 1,2,4 is two rows of four (1 + 2, then 4), each panel a head of its count."""
    from mha_trace.render import heatmaps

    assert heatmaps.packed([[1], [2, 2], [4] * 4])[1] == 4
    assert heatmaps.packed([[1], [2, 2], [4] * 4])[0] == [1, 2, 2, None, 4, 4, 4, 4]
    assert heatmaps.packed([[2, 2], [4] * 4, [8] * 8])[0] == [2, 2, 4, 4, 4, 4, None, None, *[8] * 8]
    made = _figures(kept_slides)
    assert cli("compare", "--heads", "1,2,4", "--png", str(tmp_path / "c.png")).exit_code == 0
    titles = [ax.get_title() for ax in made[0].axes[:-1]]
    assert titles == ["H=1 head 1", "H=2 head 1", "H=2 head 2", "",
                      *[f"H=4 head {h}" for h in range(1, 5)]]


@pytest.mark.slow
def test_a_config_directory_matplotlib_cannot_write_leaves_stderr_clean(tmp_path):
    """A read-only HOME (here: a config directory that cannot be made) makes matplotlib fall
    back to a temporary one and log two lines about it; --png says only what it wrote."""
    env = {**os.environ, "MPLCONFIGDIR": "/dev/null/matplotlib"}
    path = tmp_path / "heads.png"
    out = subprocess.run(["mha-trace", "heads", "--png", str(path)], capture_output=True,
                         text=True, env=env, timeout=60)
    assert out.returncode == 0 and path.stat().st_size > 10_000
    assert out.stderr.splitlines() == [f"Wrote {path} ({path.stat().st_size / 1024:.1f} KiB)"]


def test_every_shaded_cell_is_readable_in_the_notebook():
    """Numbers on shaded cells (the notebook's tables, as the terminal's) stand out from their
    background by WCAG's 4.5:1 at least: grey on viridis's mid-green once read at 1.5:1."""
    import re

    import mha_trace

    def luminance(hex_colour: str) -> float:
        channels = [int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
        linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
        return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]

    page = mha_trace.heads("chicken-road")._repr_html_() + mha_trace.explain(token="cat")._repr_html_()
    pairs = re.findall(r"color: (#[0-9a-f]{6}); text-decoration-color: #[0-9a-f]{6}; "
                       r"background-color: (#[0-9a-f]{6})", page)
    assert len(pairs) > 40
    ratios = [(max(luminance(a), luminance(b)) + 0.05) / (min(luminance(a), luminance(b)) + 0.05)
              for a, b in pairs]
    assert min(ratios) >= 4.5, sorted(zip(ratios, pairs))[:3]
