"""The README's config reference is the schema's (issue #37, item 7): a default or an allowed
value changed in the code without the README fails here."""

from __future__ import annotations

from pathlib import Path

from raysim.config_reference import END, START, render_reference

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_config_reference_is_rendered_from_the_schema():
    text = README.read_text()
    block = text[text.index(START):text.index(END) + len(END)]
    assert block == render_reference(), (
        "README.md's config reference differs from the schema; regenerate it with "
        "`python -m raysim.config_reference README.md`")


def test_reference_shows_the_real_defaults():
    block = render_reference()
    assert "  num_workers: 2 " in block  # not the 1 the hand-written block used to say
    assert "  lr: 0.01\n" in block and "  batch_size: 32\n" in block
    assert "  min_size: 1 " in block and "  scheme: iid " in block
