"""Render a student's tiled forward against the lecture's walk (`verify --module FILE:Name --impl tiled`)."""

from rich.text import Text

from mha_trace.analyses.tiled_student import TiledReport
from mha_trace.io.output import new_table
from mha_trace.records import data, renderables
from mha_trace.render.verify import _diff, _diff_data


def tiled_verdict_renderables(r: TiledReport) -> list:
    B, T, d = r.shape
    mask = ", causal" if r.causal else ""
    table = new_table(f"verify: {r.label} against attention computed whole, Q, K, V ({B}, {T}, {d}){mask}, float64")
    for name, kw in (("compares", {}), ("max |diff|", dict(justify="right", no_wrap=True)),
                     ("tolerance", dict(justify="right", no_wrap=True)), ("result", dict(no_wrap=True))):
        table.add_column(name, **kw)
    verdict = lambda x: Text("n/a", style="dim") if x is None else Text("pass", style="green") \
        if x <= r.tolerance else Text("FAIL", style="bold red")
    table.add_row("O", _diff(r.output_diff), f"{r.tolerance:.0e}", verdict(r.output_diff))
    table.add_row("logsumexp L", _diff(r.lse_diff), f"{r.tolerance:.0e}", verdict(r.lse_diff))
    for name, x in r.grad_diffs.items():
        table.add_row(f"{name} (its backward)", _diff(x), f"{r.tolerance:.0e}", verdict(x))
    tiles = f"Its tiles: {r.blocks[0]} query rows × {r.blocks[1]} keys, read off its first score tile." \
        if r.blocks else "No score tile found (no product of a tile of Q with a tile of K)."
    lines = [tiles] + [n[0].upper() + n[1:] + "." for n in r.notes]
    if r.passed:
        return [table, Text("\n".join(lines + ["Right: it computes what attention computed whole computes, "
                                               "tile by tile."]))]
    wrong_grads = [n for n, x in r.grad_diffs.items() if x > r.tolerance]
    forward_right = r.output_diff <= r.tolerance and (r.lse_diff is None or r.lse_diff <= r.tolerance)
    if forward_right and wrong_grads:
        return [table, Text("\n".join(lines + [
            f"Its forward is right; its backward's {' and '.join(wrong_grads)} differ from autograd's through "
            f"attention computed whole.", "Wrong (exit code 1)."]))]
    if r.first_wrong is not None:
        where = f"query tile {r.tile[0]}" + (f", key tile {r.tile[1]}" if r.tile[1] else "") if r.tile else "its tiles"
        lines.append(f"First wrong step, at {where}: line {r.first_wrong.line}  {r.first_wrong.source}")
    lines.append(f"Diagnosis: {r.diagnosis}." if r.diagnosis else
                 "Diagnosis: none of the known tiled mistakes gives this output exactly.")
    if r.fix:
        lines.append(f"Fix: {r.fix}.")
    return [table, Text("\n".join(lines + ["Wrong (exit code 1)."]))]


def tiled_verdict_data(r: TiledReport) -> dict:
    step = r.first_wrong
    return {"command": "verify", "module": r.label, "impl": "tiled", "causal": r.causal, "shape": list(r.shape),
            "blocks": list(r.blocks) if r.blocks else None, "passed": r.passed,
            **_diff_data("output_max_abs_diff", r.output_diff), **_diff_data("lse_max_abs_diff", r.lse_diff),
            "tolerance": r.tolerance, "gradients": {k: _diff_data("max_abs_diff", x) for k, x in r.grad_diffs.items()},
            "first_wrong_step": None if step is None else {"line": step.line, "source": step.source, "op": step.op,
                                                          "shape": list(step.shape)},
            "tile": list(r.tile) if r.tile else None, "diagnosis": r.diagnosis, "fix": r.fix, "notes": r.notes}


@renderables.register(TiledReport)
def _renderables(r: TiledReport, width: int = 100, **options) -> list:
    return tiled_verdict_renderables(r)


@data.register(TiledReport)
def _data(r: TiledReport, **options) -> dict:
    return tiled_verdict_data(r)
