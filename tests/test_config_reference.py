"""The configuration page's reference is the schema's: a default or an allowed value changed
in the code without docs/configuration.md fails here."""

from __future__ import annotations

from pathlib import Path

from raysim.configuration.reference import END, START, render_reference

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_the_config_reference_is_rendered_from_the_schema():
    text = PAGE.read_text()
    block = text[text.index(START):text.index(END) + len(END)]
    assert block == render_reference(), (
        "docs/configuration.md's config reference differs from the schema; regenerate it with "
        "`python -m raysim.configuration.reference docs/configuration.md`")


def test_reference_shows_the_real_defaults():
    block = render_reference()
    assert "  num_workers: 2 " in block  # not the 1 the hand-written block used to say
    assert "  lr: 0.01\n" in block and "  batch_size: 32\n" in block
    assert "  min_size: 1 " in block and "  scheme: iid " in block
