"""Render the `configs` listing. Imports neither torch nor numpy."""

from rich.table import Table

from mha_trace.output import new_table


def configs_table(configs) -> Table:
    table = new_table("Bundled configs (use: mha-trace heads --config NAME)")
    table.add_column("name", style="bold", no_wrap=True)
    table.add_column("title / what it shows", ratio=1)
    table.add_column("tokens", justify="right")
    table.add_column("d_model", justify="right")
    table.add_column("heads", justify="right")
    table.add_column("form")
    for c in configs:
        form = "explicit" if c.explicit else "generated"
        if c.mask != "none":
            form += f", {c.mask}"
        if c.W_O:
            form += ", W_O"
        table.add_row(c.name, f"{c.title}\n{c.description}".strip(), str(len(c.tokens)),
                      str(c.d_model), str(c.heads), form)
    return table


def configs_data(configs) -> dict:
    return {"command": "configs",
            "configs": [{"name": c.name, "title": c.title, "description": c.description,
                         "tokens": list(c.tokens), "d_model": c.d_model, "heads": c.heads,
                         "mask": c.mask, "explicit": c.explicit} for c in configs]}
