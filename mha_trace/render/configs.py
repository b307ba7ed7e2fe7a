"""Render the `configs` and `examples` listings. Imports neither torch nor numpy."""

from rich.table import Table

from mha_trace.io.output import new_table


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


def examples_table(found) -> Table:
    table = new_table("Bundled examples (use: mha-trace shapes --module example:NAME)")
    table.add_column("name", style="bold", no_wrap=True)
    table.add_column("class", no_wrap=True)
    table.add_column("what it is", ratio=1)
    for e in found:
        table.add_row(e.spec, ", ".join(e.classes), e.about)
    return table


def examples_data(found) -> dict:
    return {"command": "examples",
            "examples": [{"name": e.name, "spec": e.spec, "classes": list(e.classes),
                          "about": e.about, "file": e.path.name} for e in found]}
