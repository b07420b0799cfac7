"""The README documents every setting with its real default, and its commands exist."""

import re
from pathlib import Path

from agentloop.settings import Settings

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def documented_settings() -> dict[str, str]:
    block = README.split("<!-- readme:settings -->")[1].split("<!-- /readme:settings -->")[0]
    rows = re.findall(r"^\| `AGENTLOOP_(\w+)` \| ([^|]+) \|", block, flags=re.MULTILINE)
    return {name.lower(): default.strip() for name, default in rows}


def render_default(value: object) -> str:
    if value is None:
        return "unset"
    return f"`{str(value).lower() if isinstance(value, bool) else value}`"


def test_every_setting_is_documented_with_its_default():
    documented = documented_settings()
    fields = Settings.model_fields
    assert set(documented) == set(fields), set(documented) ^ set(fields)
    for name, field in fields.items():
        assert documented[name] == render_default(field.default), name


def test_readme_commands_exist():
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    for target in ("run", "test", "lint", "bench"):
        assert re.search(rf"^{target}:", makefile, flags=re.MULTILINE), target


def test_every_training_option_is_documented():
    import dataclasses

    from agentloop.learner.config import LoopConfig

    text = (Path(__file__).parents[1] / "docs" / "learning.md").read_text()
    documented = set(re.findall(r"^\| `(\w+)` \|", text, flags=re.MULTILINE))
    assert documented == {f.name for f in dataclasses.fields(LoopConfig)}
