"""The README and the guide in docs/ show real output: each `$ mha-trace ...` block is what the
command prints now; the README is a first read, with the two set-up commands first."""

import re
from pathlib import Path

import pytest
from guide import BLOCKS, readme
from snapshots import differences

pytestmark = pytest.mark.slow  # loads a real model, trains, or starts processes and browsers

ROOT = Path(__file__).parent.parent


def test_the_guide_has_examples_of_every_command():
    commands = {cmd.split()[1] for _, cmd, _ in BLOCKS}
    assert commands >= {"shapes", "heads", "explain", "compare", "ablate", "configs", "cost", "verify",
                        "survey", "predict"}


def test_readme_starts_with_the_two_setup_commands_each_on_its_own():
    """The first code block installs and runs; the second is exactly what CI runs."""
    text = readme.README.read_text()
    blocks = [b.strip() for b in text.split("```bash\n")[1:3]]
    install, test = (b.split("\n```")[0] for b in blocks)
    assert "\n" not in install and install.endswith("&& mha-trace shapes") and "[plot]" in install
    assert "\n" not in test and test in (ROOT / ".ci" / "run").read_text().splitlines()
    assert text.index("```bash") < 300  # the first thing a reader sees


def test_readme_is_a_first_read_and_links_every_page_of_the_guide():
    text = readme.README.read_text()
    assert len(text.splitlines()) <= 300
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md")
    assert all(f"(docs/{p})" in text for p in pages), pages
    index = (ROOT / "docs" / "README.md").read_text()
    assert all(f"({p})" in index for p in pages)


def test_every_relative_link_in_the_guide_leads_to_a_file():
    for page in readme.PAGES:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name}: {target}"


@pytest.fixture
def trained_once(default_run, train_once, monkeypatch):
    """A run a block trains is trained once for the whole run (conftest's `train_once`): the default
    run is the one saved once (`default_run`, which test_train and test_composition read), the
    others the ones test_train's exercises read; the command does everything else as it would."""
    from mha_trace.models import checkpoints, training

    saved, train = checkpoints.read_checkpoint(str(default_run)), training.run_training

    def run_training(spec, on_step=lambda loss: None, resume=None):
        if resume is not None:
            return train(spec, on_step, resume)
        return saved if spec == saved.spec else train_once(spec)

    monkeypatch.setattr(training, "run_training", run_training)


@pytest.fixture
def each_line_once(tmp_path_factory, monkeypatch):
    """A command line that several blocks show through different pipes (the README's class and
    the guide's) runs once for the whole run, whichever worker asks first."""
    import hashlib

    from conftest import once_per_run_value

    real = readme.printed
    shared = lambda line: once_per_run_value(
        tmp_path_factory, "printed-" + hashlib.sha256(line.encode()).hexdigest()[:16], lambda: real(line))
    monkeypatch.setattr(readme, "printed", shared)


@pytest.mark.parametrize("page,command,body", BLOCKS, ids=[f"{p}: {c}" for p, c, _ in BLOCKS])
def test_readme_block_is_real_output(page, command, body, request, each_line_once):
    if command.split()[1] == "train":
        request.getfixturevalue("trained_once")
    found = differences(readme.output(command), body)
    assert found == [], "python docs/readme.py refreshes the README\n" + "\n".join(found)


def test_sources_are_named_by_their_titles_not_internal_file_names():
    shown = readme.output("mha-trace examples") + "".join(p.read_text() for p in readme.PAGES)
    assert "L04 lecture notes" in shown and 'the chapter "Multi-Head Attention"' in readme.README.read_text()
    assert not re.search(r"seed 00\d|seeds/|\d{3}_[0-9a-f]{16}", shown)


def _documented_commands() -> list:
    """(page, line) for every `mha-trace ...` line in a code block of README and docs/, the `$`
    blocks included, without its trailing comment or pipe."""
    found = []
    for page in readme.PAGES:
        for block in re.findall(r"```[a-z]*\n(.*?)```", page.read_text(), re.S):
            for line in block.splitlines():
                line = line.removeprefix("$ ").strip()
                if line.startswith("mha-trace ") and "..." not in line:
                    found.append((page.name, re.sub(r"\s#\s.*$", "", line).split(" | ")[0].strip()))
    return found


def test_every_documented_command_line_parses():
    """Each command line in the guide is one the command line takes (its options, their values
    and choices), whether or not the guide shows its output: a renamed flag fails here."""
    import shlex

    import typer

    from mha_trace.cli import app

    group = typer.main.get_command(app)
    failed = []
    for page, line in _documented_commands():
        args = shlex.split(line)[1:]
        try:
            with group.make_context("mha-trace", list(args), resilient_parsing=False) as ctx:
                name, command, rest = group.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
                command.make_context(name, rest, parent=ctx).close()
        except Exception as e:  # noqa: BLE001 (click's, as typer vendors it)
            if type(e).__name__ != "Exit":  # --help, --version exit; anything else is refused
                failed.append(f"{page}: {line}: {e.format_message() if hasattr(e, 'format_message') else e}")
    assert failed == []


def test_every_saved_step_the_guide_names_is_saved_by_the_run_it_names():
    """`--at-step N` and `run.pt@N` name a step the default run (`mha-trace train --save run.pt`)
    snapshots: once the guide named steps 278 and 395, which no run saves."""
    from mha_trace.models.training import Spec, snapshot_steps

    saved = set(snapshot_steps(Spec.of("induction")))
    text = "".join(p.read_text() for p in readme.PAGES)
    named = {int(n) for n in re.findall(r"--at-step (\d+)|run\.pt@(\d+)", text) for n in n if n}
    assert named and named <= saved, sorted(named - saved)
