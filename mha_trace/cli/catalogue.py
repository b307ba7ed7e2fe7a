"""`configs` and `examples`: what is bundled, and how to run it."""

from mha_trace.cli.app import app
from mha_trace.cli.options import output_options
from mha_trace.io.output import Output, emit


@app.command(short_help="The bundled configs and what each shows.")
@output_options()
def configs(out: Output = None):
    """List the bundled configs: name, title, tokens, d_model, heads, and what each shows.

    Example: mha-trace configs
    """
    from mha_trace.runs.config import bundled_names, load_config
    from mha_trace.render.configs import configs_data, configs_table

    found = [load_config(name) for name in bundled_names()]
    emit(out, lambda: [configs_table(found)], lambda: configs_data(found))


@app.command(short_help="The bundled example implementations (--module example:NAME).")
@output_options()
def examples(out: Output = None):
    """List the bundled example implementations (the seed texts' classes, as written), each
    runnable from anywhere with --module example:NAME.

    Example: mha-trace examples
    Example: mha-trace shapes --module example:l04 --d-model 64 --heads 4
    """
    from mha_trace.runs.bundled import examples as found
    from mha_trace.render.configs import examples_data, examples_table

    listed = found()
    emit(out, lambda: [examples_table(listed)], lambda: examples_data(listed))
