"""The bundled presets: published models' attention dimensions (mha_trace/presets/*.toml), read by
name only (never a path). No torch."""

from mha_trace.errors import MhaError


def presets_dir():
    from pathlib import Path

    return Path(__file__).resolve().parent.parent / "presets"


def preset_names() -> list[str]:
    return sorted(p.stem for p in presets_dir().glob("*.toml"))


def load_preset(name: str) -> dict:
    import tomllib

    if name not in preset_names():  # a name, never a path: only the bundled presets are read
        raise MhaError(f"preset '{name}' is not bundled (presets: {', '.join(preset_names())})",
                       quantity="preset")
    with open(presets_dir() / f"{name}.toml", "rb") as f:
        return tomllib.load(f)
