"""The experiment configuration: YAML + ``--set key=value`` overrides, validated with one clear
message per problem (unknown keys are errors)."""

from __future__ import annotations

import copy
import difflib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Optional, Union, get_args

import yaml
from pydantic import BaseModel, Field, ValidationError, create_model, model_validator

from raysim.algorithms.params import ALGORITHM_PARAMS, algorithm_params
from raysim.configuration.schema import (
    DatasetConfig,
    EngineConfig,
    EvaluationConfig,
    LoggingConfig,
    PartitionConfig,
    StrictModel,
    TrainingConfig,
)
from raysim.errors import ConfigError
from raysim.layers.registry import FEATURES
from raysim.models.params import MODEL_PARAMS, model_params
from raysim.plugins import load_plugins
from raysim.seeding import numpy_rng

if TYPE_CHECKING:  # the unions are built from the registries at run time
    ModelParams = Any
    AlgorithmParams = Any
else:
    ModelParams = Annotated[
        Union[MODEL_PARAMS],  # noqa: UP007
        Field(discriminator="name"),
    ]
    AlgorithmParams = Annotated[
        Union[ALGORITHM_PARAMS],  # noqa: UP007
        Field(discriminator="name"),
    ]


class ClientsConfig(StrictModel):
    """Per-client settings: an architecture per client (model heterogeneity) and an input
    resolution per client. Without ``architectures`` every client uses ``model``."""

    architectures: list[ModelParams] | None = Field(
        None, description="model names (or model sections) assigned to clients by `assign`")
    assign: Literal["list", "cycle", "draw"] = Field(
        "list", description="list: one entry per client, in order; cycle: client c gets entry "
        "c mod len; draw: each client draws an entry uniformly (seeded per run)")
    downsample: list[int] | None = Field(
        None, description="one factor per client: its images (training and test) are "
        "average-pooled by this factor, e.g. [1, 2, 4, 8]")

    @model_validator(mode="before")
    @classmethod
    def _names_to_sections(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("architectures"), list):
            data = {**data, "architectures": [{"name": a} if isinstance(a, str) else a
                                              for a in data["architectures"]]}
        return data

    @model_validator(mode="after")
    def _check(self) -> ClientsConfig:
        if self.architectures is not None and not self.architectures:
            raise ValueError("architectures is empty; list at least one model name")
        if self.downsample is not None and any(f < 1 for f in self.downsample):
            raise ValueError(f"downsample factors must be >= 1, got {self.downsample}")
        return self

    def resolve(self, default: StrictModel, num_clients: int, seed: int
                ) -> tuple[StrictModel, ...]:
        """The architecture of every client of the partition (seeded for ``assign: draw``)."""
        entries = self.architectures
        if entries is None:
            return (default,) * num_clients
        if self.assign == "list":
            return tuple(entries)
        if self.assign == "cycle":
            return tuple(entries[c % len(entries)] for c in range(num_clients))
        picks = numpy_rng(seed, "architectures").integers(len(entries), size=num_clients)
        return tuple(entries[int(i)] for i in picks)


class _ExperimentFields(StrictModel):
    """One experiment: data, partition, model, algorithm, training, evaluation, seeds, engine,
    and a section per feature of :data:`~raysim.layers.registry.FEATURES` (``privacy``,
    ``server_optimizer``, ``system``, ``compression``: None when off)."""

    name: str = Field("experiment", pattern=r"^[A-Za-z0-9_.-]+$",
                      description="letters, digits, _ . -; names the results directory")
    dataset: DatasetConfig
    partition: PartitionConfig = PartitionConfig()
    model: ModelParams
    algorithm: AlgorithmParams
    training: TrainingConfig = TrainingConfig()
    evaluation: EvaluationConfig = EvaluationConfig()
    seeds: list[int] = Field([0], min_length=1,
                             description="run concurrently (as many at once as resources allow)")
    clients: ClientsConfig = ClientsConfig()
    engine: EngineConfig = EngineConfig()
    logging: LoggingConfig = LoggingConfig()
    plugins: list[str] = Field(
        [], description="modules to import before the config is read, which register their "
        "own algorithms, models and datasets (e.g. [my_lab.fedfoo]; `--plugin` adds one)")
    output: str = "results"

    @model_validator(mode="after")
    def _check_cross_fields(self) -> _ExperimentFields:
        per_round = self.training.clients_per_round
        if per_round is not None and per_round > self.partition.num_clients:
            raise ValueError(
                f"training.clients_per_round={per_round} exceeds partition.num_clients="
                f"{self.partition.num_clients}; sample at most as many clients as there are"
            )
        num_clients = self.partition.num_clients
        for key, values in (("architectures", self.clients.architectures),
                            ("downsample", self.clients.downsample)):
            if values is None or (key == "architectures" and self.clients.assign != "list"):
                continue
            if len(values) != num_clients:
                raise ValueError(
                    f"clients.{key} lists {len(values)} entries for partition.num_clients="
                    f"{num_clients}; give one per client"
                    + (", or use clients.assign=cycle or draw" if key == "architectures" else ""))
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds {self.seeds} repeat a seed; list each seed once")
        return self

    @property
    def clients_per_round(self) -> int:
        """Clients sampled per round (default: all)."""
        return self.training.clients_per_round or self.partition.num_clients

    def section(self, name: str) -> Any:
        """A feature's config section by its name (None when absent)."""
        return getattr(self, name)


if TYPE_CHECKING:
    ExperimentConfig = _ExperimentFields
else:  # and one optional section per feature, named by the feature
    ExperimentConfig = create_model(
        "ExperimentConfig", __base__=_ExperimentFields, __module__=__name__,
        __doc__=_ExperimentFields.__doc__,
        **{entry.section: (Optional[entry.schema], None)  # noqa: UP045
           for entry in FEATURES})


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (through Optional, unions, Annotated, lists)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for argument in get_args(annotation) for model in _models_in(argument)]


def keys_allowed_at(path: list[str]) -> list[str]:
    """The keys a config section takes, the section named by pydantic's error location
    ``path`` (which names a model's or algorithm's tag after ``model``/``algorithm``)."""
    models: list[type[BaseModel]] = [ExperimentConfig]
    for part in path:
        inside = [found for model in models if part in model.model_fields
                  for found in _models_in(model.model_fields[part].annotation)]
        tagged = [model for model in models if "name" in model.model_fields
                  and part in get_args(model.model_fields["name"].annotation)]
        models = inside or tagged
    return sorted({key for model in models for key in model.model_fields})


def _describe_allowed(error: Mapping[str, Any]) -> str:
    kind, message = error["type"], error["msg"]
    if kind == "extra_forbidden":
        location = [str(part) for part in error["loc"]]
        close = difflib.get_close_matches(location[-1], keys_allowed_at(location[:-1]), n=1)
        return "this key is not allowed here (" + (
            f"did you mean `{close[0]}`?" if close else "check its spelling and indentation") + ")"
    if kind == "union_tag_invalid":
        expected = error.get("ctx", {}).get("expected_tags", "")
        return f"unknown name; allowed names: {expected}"
    if kind == "missing":
        return "this field is required"
    message = message.removeprefix("Value error, ")
    return message[0].lower() + message[1:] if message else kind


def format_validation_error(error: ValidationError) -> str:
    """One paragraph listing each problem as field, value and what is allowed."""
    problems = []
    for item in error.errors():
        location = [str(part) for part in item["loc"]]
        if item["type"] == "union_tag_invalid":
            location.append("name")
        elif len(location) >= 2 and location[0] in ("model", "algorithm"):
            location.pop(1)  # drop the discriminator tag pydantic inserts
        elif len(location) >= 4 and location[:2] == ["clients", "architectures"]:
            location.pop(3)
        if not location:  # a rule across sections: its message names the fields
            problems.append(_describe_allowed(item))
            continue
        field = ".".join(location)
        value = item.get("input")
        if item["type"] == "union_tag_invalid":
            value = item.get("ctx", {}).get("tag", value)
        shown = "" if item["type"] == "missing" or isinstance(value, dict) else f" = {value!r}"
        problems.append(f"`{field}`{shown}: {_describe_allowed(item)}")
    plural = "s" if len(problems) > 1 else ""
    return (f"Invalid config field{plural}: " + "; ".join(problems) +
            ". Fix the YAML file or override with `--set field=value`; `raysim validate CONFIG` "
            "checks a config without running it.")


NAMED_SECTIONS = ("model", "algorithm")
"""Sections whose fields depend on their ``name``: an override that switches the name starts
the section afresh (the new model's or method's defaults), since the old one's fields mean
nothing to it."""


def _parsed_override(override: str) -> tuple[list[str], Any]:
    """The dotted key of ``key.sub=value`` as its parts, and the value parsed as YAML (kept as
    text where it is no YAML)."""
    key, separator, text = override.partition("=")
    if not separator or not key.strip():
        raise ConfigError(
            f"Invalid override {override!r}: expected `--set key=value` with a dotted key, "
            "e.g. `--set training.rounds=20`."
        )
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = text
    return key.strip().split("."), value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` overrides (values parsed as YAML) to a raw config dict. An
    override of ``model.name`` or ``algorithm.name`` to another name replaces that section by
    ``{name: ...}``: the other fields come from the new name's defaults and from the other
    overrides (``--set model.name=cnn --set model.channels=[8,16]``)."""
    result = copy.deepcopy(raw)
    parsed = [(override, *_parsed_override(override)) for override in overrides]
    for _, parts, value in parsed:  # a new name first: the old one's fields mean nothing to it
        current = result.get(parts[0])
        if parts[0] in NAMED_SECTIONS and parts[1:] == ["name"] and isinstance(current, dict) \
                and current.get("name") != value:
            result[parts[0]] = {}
    for override, parts, value in parsed:
        node = result
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(
                    f"Invalid override {override!r}: `{'.'.join(parts[:depth + 1])}` is "
                    f"{child!r}, not a section, so it has no field `{parts[depth + 1]}`."
                )
            node = child
        node[parts[-1]] = value
    return result


def _union(members: tuple[type[StrictModel], ...]) -> Any:
    return Annotated[Union[members], Field(discriminator="name")]  # noqa: UP007


def sync_plugin_names() -> None:
    """Extend the ``model`` and ``algorithm`` unions of the schema (and of
    ``clients.architectures``) with the names plug-ins registered since the last call, so that
    they validate, are suggested in "did you mean" and listed as allowed like shipped ones."""
    models, algorithms = model_params(), algorithm_params()
    if (get_args(ExperimentConfig.model_fields["model"].annotation) == models
            and get_args(ExperimentConfig.model_fields["algorithm"].annotation) == algorithms):
        return
    fields, clients = ExperimentConfig.model_fields, ClientsConfig.model_fields
    fields["model"].annotation = Union[models]  # type: ignore[assignment]  # noqa: UP007
    fields["algorithm"].annotation = Union[algorithms]  # type: ignore[assignment]  # noqa: UP007
    clients["architectures"].annotation = list[_union(models)] | None  # type: ignore[misc,assignment]
    ClientsConfig.model_rebuild(force=True)
    ExperimentConfig.model_rebuild(force=True)


def parse_config(raw: Any, near: Path | None = None) -> ExperimentConfig:
    """Validate a raw config mapping; raise :class:`ConfigError` with one clear message. Its
    ``plugins`` are imported first (``near``: the config file's directory, where they may
    lie), so the names they register validate like shipped ones."""
    if not isinstance(raw, dict):
        raise ConfigError(
            f"The config must be a YAML mapping of sections (dataset, partition, model, "
            f"algorithm, ...), not {type(raw).__name__}. See experiments/quickstart.yaml."
        )
    plugins = raw.get("plugins", [])
    if not isinstance(plugins, list):
        raise ConfigError(
            f"Invalid config field `plugins` = {plugins!r}: expected a list of module names, "
            "e.g. `plugins: [my_lab.fedfoo]`.")
    load_plugins(plugins, near)
    return validated_config(raw)


def validated_config(raw: dict[str, Any]) -> ExperimentConfig:
    """Validate a raw config mapping against the methods and models registered now, importing
    nothing: how a config read from a results directory is compared (its ``plugins`` are names
    a directory holds, never imported; one it names that is not loaded fails to validate)."""
    sync_plugin_names()
    try:
        return ExperimentConfig.model_validate(raw)
    except ValidationError as error:
        raise ConfigError(format_validation_error(error)) from None


def load_experiments(path: str | Path, overrides: list[str] | None = None,
                     plugins: Sequence[str] = ()) -> dict[str, ExperimentConfig]:
    """Read a YAML file that may hold ``variants:`` (label -> overrides, e.g. a method and its
    baselines) and return one validated config per variant ({"": config} without variants).

    Each variant applies its dotted-key overrides (like ``--set``, applied after them) to the
    base config; its runs go to ``<run root>/<label>/seed_<s>``, so the label is the
    ``experiment`` of :func:`raysim.results.load` and ``raysim report``.

    ``plugins``: modules to import (``--plugin``), added to the config's ``plugins``; they
    and the config's own are looked for beside the YAML file too.
    """
    return experiments_from_raw(_read_yaml(path), overrides, plugins, Path(path).parent)


def experiments_from_raw(raw: Any, overrides: list[str] | None = None,
                         plugins: Sequence[str] = (), near: Path | None = None
                         ) -> dict[str, ExperimentConfig]:
    """:func:`load_experiments` for a config already read (e.g. a dict built in Python)."""
    raw = copy.deepcopy(raw)
    if plugins and isinstance(raw, dict):
        listed = raw.get("plugins") or []
        raw["plugins"] = [*listed, *(name for name in plugins if name not in listed)]
    if not isinstance(raw, dict) or "variants" not in raw:
        return {"": _parse_raw(raw, overrides, near)}
    variants = raw.pop("variants")
    if not isinstance(variants, dict) or not variants or not all(
            isinstance(v, dict | None) for v in variants.values()):
        raise ConfigError(
            f"Invalid config field `variants` = {variants!r}: expected a mapping of variant "
            "labels to mappings of dotted-key overrides, e.g. `variants: {fedavg: "
            "{algorithm.aggregation_period: 1}}`."
        )
    base = apply_overrides(raw, overrides or [])
    experiments = {}
    for label, changes in variants.items():
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", str(label)):
            raise ConfigError(f"Invalid variant label {label!r}: use letters, digits, _ . -")
        entries = [f"{key}={yaml.safe_dump(value, default_flow_style=True).strip()}"
                   for key, value in (changes or {}).items()]
        try:
            experiments[str(label)] = parse_config(apply_overrides(base, entries), near)
        except ConfigError as error:
            raise ConfigError(f"In variant `{label}`: {error}") from None
    return experiments


class DuplicateKeyError(yaml.YAMLError):
    """A mapping sets the same key twice."""

    def __init__(self, key: str, first: int, second: int):
        super().__init__(f"duplicate key {key!r}")
        self.key, self.first, self.second = key, first, second


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load that refuses a key set twice in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            line = key_node.start_mark.line + 1
            if key in seen:
                raise DuplicateKeyError(str(key), seen[key], line)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _read_yaml(path: str | Path) -> Any:
    path = Path(path)
    if path.is_dir():
        raise ConfigError(
            f"Config path {str(path)!r} is a folder, not a config file. Pass the path of an "
            "experiment YAML file in it, e.g. `raysim run experiments/quickstart.yaml`.")
    if not path.is_file():
        raise ConfigError(
            f"Config file {str(path)!r} does not exist. Pass the path of an experiment YAML "
            "file, e.g. `raysim run experiments/quickstart.yaml`."
        )
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader) or {}
    except UnicodeDecodeError:
        raise ConfigError(
            f"Config file {str(path)!r} is not a text file (not UTF-8). Pass the path of an "
            "experiment YAML file, e.g. `raysim run experiments/quickstart.yaml`."
        ) from None
    except DuplicateKeyError as error:
        raise ConfigError(
            f"Config file {str(path)!r} sets `{error.key}` twice (line {error.first} and line "
            f"{error.second}); YAML would silently keep the later value. Keep one of them."
        ) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or "syntax error"
        raise ConfigError(
            f"Config file {str(path)!r} is not valid YAML{where}: {problem}. Fix the syntax."
        ) from None


def load_config(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Read a YAML experiment config, apply overrides and validate it."""
    return _parse_raw(_read_yaml(path), overrides, Path(path).parent)


def with_overrides(config: ExperimentConfig, overrides: list[str]) -> ExperimentConfig:
    """``config`` with ``--set``-style ``KEY=VALUE`` overrides applied, validated as the command
    line's are."""
    return parse_config(apply_overrides(config.model_dump(mode="json"), overrides))


def _parse_raw(raw: Any, overrides: list[str] | None, near: Path | None) -> ExperimentConfig:
    return parse_config(apply_overrides(raw, overrides or []) if isinstance(raw, dict) else raw,
                        near)
