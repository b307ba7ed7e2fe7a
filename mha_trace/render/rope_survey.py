"""Render `survey --rope-planes`: each head's |q·k| by band of RoPE planes, beside its
previous-token score."""

import numpy as np
from rich.text import Text

from mha_trace.analyses.rope_planes import wavelength
from mha_trace.analyses.rope_survey import RopeShares
from mha_trace.io.output import new_table, undefined_or
from mha_trace.records import data, renderables
from mha_trace.io.units import turn_text
from mha_trace.core.head import Head

PREVIOUS = 0.5  # a previous-token head: at least half its weight on the token before


def _band_names(r: RopeShares) -> list[str]:
    return [f"plane {b.start}" if len(b) == 1 else f"planes {b.start}–{b.stop - 1}"
            for b in r.band_planes]


def _table(r: RopeShares, title: str, order: np.ndarray, top: int):
    table = new_table(title)
    table.add_column("head")
    table.add_column("previous token", justify="right")
    for name in _band_names(r):
        table.add_column(name, justify="right")
    bands = r.bands
    for i in order[:top]:
        layer, head = divmod(int(i), r.shares.shape[1])
        table.add_row(Head.at(layer, head).name, f"{r.previous[layer, head]:.3f}",
                      *(f"{x:.0%}" for x in bands[layer, head]))
    return table


def rope_survey_renderables(r: RopeShares, top: int) -> list:
    bands, planes = r.bands, r.band_planes
    turns = ", ".join(f"{name}: one turn every {turn_text(r.frequencies[b.start])}"
                      + ("" if len(b) == 1 else f"–{turn_text(r.frequencies[b.stop - 1])}") + " tokens"
                      for b, name in zip(planes, _band_names(r)))
    positional = r.previous >= PREVIOUS
    fast = bands[..., 0]
    out = [Text(f"{r.card.name}: each head's |q·k| by band of RoPE planes, over {r.corpus}",
                style="bold"),
           Text(f"Every head turns every plane (the frequency belongs to a pair of dims); a head "
                f"leans on some. The planes in {len(planes)} band{'s' * (len(planes) != 1)}, fastest first: {turns}. "
                f"Each share is the band's part of Σ|q'·k'| over every query and each key it sees."),
           _table(r, "The previous-token heads", np.argsort(-r.previous.ravel(), kind="stable"), top),
           _table(r, "The heads leaning most on the fastest planes", np.argsort(-fast.ravel(), kind="stable"), top)]
    out.append(Text(" ".join(_verdict(r, positional, fast, bands))))
    return out


def _verdict(r: RopeShares, positional, fast, bands) -> list[str]:
    """What the numbers say of Barbero et al.'s claim and of the chapter's, read off the data."""
    rho = r.rank_correlation
    lines = [f"Over all {fast.size} heads the fastest band's share "
             f"{'rises' if rho > 0 else 'falls'} with the previous-token score: Spearman ρ = {rho:.2f}."
             if rho is not None else "With one head there is no ranking of heads to correlate (Spearman's ρ is undefined)."]
    holds = rho is not None and rho >= 0.5
    if positional.any():
        lines.append(f"The {int(positional.sum())} previous-token heads (score ≥ {PREVIOUS}) give "
                     f"the fastest band {fast[positional].min():.0%}–{fast[positional].max():.0%}, "
                     f"against a median of {np.median(fast):.0%} over all heads.")
        holds = holds and bool((fast[positional] > np.median(fast)).all())
    lines.append(f"The slowest band carries {bands[..., -1].mean():.0%} of |q·k| on average, in "
                 f"planes that barely turn over a sentence (content, not position). Barbero et al. "
                 f"2025 report that high frequencies build positional heads and low ones carry "
                 f"semantics: on these sentences that {'holds' if holds else 'does not hold as stated'}.")
    alone = bands.max(-1) >= 0.9
    lines.append("No head uses one band alone: every head rotates at every frequency, which answers "
                 "the chapter's \"some heads\" at low frequency and \"others\" at high." if not alone.any()
                 else f"{int(alone.sum())} head(s) put 90% or more on one band.")
    return lines


def rope_survey_data(r: RopeShares, top: int) -> dict:
    return {"command": "survey", "rope_planes": True, "model": r.card.name, "corpus": r.corpus,
            "sentences": r.sentences, "bands": len(r.band_planes),
            "planes": [{"plane": i, "theta": float(t), "wavelength": wavelength(t)}
                       for i, t in enumerate(r.frequencies)],
            "previous_token": np.round(r.previous, 4).tolist(),
            "band_shares": np.round(r.bands, 4).tolist(),
            "plane_shares": np.round(r.shares, 4).tolist(),
            **undefined_or("spearman_previous_vs_fastest_band", r.rank_correlation, 4,
                           "one head: no ranking of heads to correlate")}


@renderables.register(RopeShares)
def _survey(r, width: int, top: int = 5, **_) -> list:
    return rope_survey_renderables(r, max(top, 5))


@data.register(RopeShares)
def _survey_data(r, top: int = 5, **_) -> dict:
    return rope_survey_data(r, top)
