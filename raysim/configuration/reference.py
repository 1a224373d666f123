"""The experiment-config reference of docs/configuration.md, rendered from the schema itself (defaults,
allowed values, descriptions), so that a config written from it gets the values its reader
expects. ``tests/test_config_reference.py`` fails when the page's block drifts from this
rendering; ``python -m raysim.configuration.reference docs/configuration.md`` rewrites the block."""

from __future__ import annotations

import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from raysim.configuration.experiment import ExperimentConfig

START, END = "<!-- config-reference: start -->", "<!-- config-reference: end -->"
COMMENT_COLUMN = 33


def _choices(annotation: Any) -> list[Any] | None:
    """The allowed values of a Literal annotation (also inside ``X | None``)."""
    if typing.get_origin(annotation) is Literal:
        return list(typing.get_args(annotation))
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _choices(arg)
            if found:
                return found
    return None


def _model_class(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model of a field (also inside ``X | None``), if it has one."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [a for a in typing.get_args(annotation)
                  if isinstance(a, type) and issubclass(a, BaseModel)]
        return models[0] if len(models) == 1 else None
    return None


def _flow(value: Any) -> str:
    """A default as YAML flow text."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix(
        "\n...").removesuffix(" ...")


def _comment(field: FieldInfo, annotation: Any) -> str:
    parts = []
    choices = _choices(annotation)
    if choices and len(choices) > 1:
        parts.append(" | ".join(str(c) for c in choices))
    if field.description:
        parts.append(" ".join(field.description.split()))
    return "; ".join(parts)


def _line(indent: int, key: str, value: str, comment: str) -> str:
    text = f"{' ' * indent}{key}:{(' ' + value) if value else ''}"
    if comment:
        text = f"{text.ljust(COMMENT_COLUMN - 1)} # {comment}"
    return text


def _union_names(annotation: Any) -> list[str]:
    """The ``name`` literals of the shipped models or methods a union holds (the reference
    documents raysim's own; names a plug-in registered in this process are left out)."""
    from raysim.algorithms.params import ALGORITHM_PARAMS
    from raysim.models.params import MODEL_PARAMS

    shipped = {*ALGORITHM_PARAMS, *MODEL_PARAMS}
    names = []
    for arg in typing.get_args(annotation):
        if isinstance(arg, type) and issubclass(arg, BaseModel) and "name" in arg.model_fields \
                and arg in shipped:
            names.append(str(arg.model_fields["name"].default))
    return names


def _section(model: type[BaseModel], indent: int) -> list[str]:
    lines = []
    for key, field in model.model_fields.items():
        annotation = field.annotation
        nested = _model_class(annotation)
        comment = _comment(field, annotation)
        if field.is_required():
            names = _union_names(annotation)
            if names:
                lines.append(_line(indent, key, "{name: ...}",
                                   f"required; name: {' | '.join(names)} (each with its own "
                                   "keys, below)"))
            elif nested is not None:
                lines.append(_line(indent, key, "", comment))
                lines += _section(nested, indent + 2)
            else:
                lines.append(_line(indent, key, "", f"required; {comment}" if comment
                                   else "required"))
            continue
        default = field.get_default(call_default_factory=True)
        if nested is not None and default is not None:
            lines.append(_line(indent, key, "", comment))
            lines += _section(nested, indent + 2)
        elif nested is not None:  # an optional section, off by default
            keys = ", ".join(f"{k}: {_flow(f.default)}" for k, f in nested.model_fields.items()
                             if not f.is_required())
            lines.append(_line(indent, key, "null", f"{comment + '; ' if comment else ''}"
                               f"or {{{keys}}}"))
        else:
            lines.append(_line(indent, key, _flow(default), comment))
    return lines


def _by_name(section: str, classes: tuple[type[BaseModel], ...]) -> list[str]:
    """Each registered model's or method's own keys with their defaults, one ``section:``
    entry per name (the classes' docstrings as the headings)."""
    lines = [f"# ---- {section}: the keys of each name ----"]
    for params in sorted(classes, key=lambda c: str(c.model_fields["name"].default)):
        lines.append(_line(0, section, "", _summary(params)))
        lines += _section(params, 2)
    return lines


def _summary(params: type[BaseModel]) -> str:
    """The first sentence of a parameter class's own docstring (none: empty)."""
    doc = params.__dict__.get("__doc__") or ""
    return " ".join(doc.split()).split(". ")[0].rstrip(".") if doc.strip() else ""


def render_reference() -> str:
    """The config reference as a fenced YAML block (every key of ExperimentConfig with its
    default, its allowed values and its description), then every registered model's and
    method's own keys."""
    from raysim.algorithms.params import ALGORITHM_PARAMS
    from raysim.models.params import MODEL_PARAMS

    body = "\n".join([*_section(ExperimentConfig, 0), "", *_by_name("model", MODEL_PARAMS), "",
                      *_by_name("algorithm", ALGORITHM_PARAMS)])
    return f"{START}\n```yaml\n{body}\n```\n{END}"


def replace_block(text: str) -> str:
    """``text`` (the configuration page) with its reference block rendered anew."""
    start, end = text.index(START), text.index(END) + len(END)
    return text[:start] + render_reference() + text[end:]


if __name__ == "__main__":
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/configuration.md")
    path.write_text(replace_block(path.read_text()))
