"""Recipe files: a YAML list of steps with options, validated before anything runs.

A recipe looks like::

    target: {tensorrt: "10.3"}      # optional: the TensorRT version to prepare for
    steps:
      - sanitize
      - replace: {only: [LayerNorm]}
      - infer_shapes
      - fold: {max_passes: 5}
      - validate: {atol: 1.0e-5}

Each step name must be one that ``gskit.pipeline.steps.STEPS`` defines, and each option one of that step's
option dataclass fields, with a value of the field's type. Errors name the file and line of the culprit.
Options that name a file (``validate.inputs``, ``build.timing_cache``) are relative to the recipe file's
folder, so a recipe and its inputs can move together; ``parse_recipe`` text keeps them as written.

The target (``target: {tensorrt: VERSION}``) is the run's: replace picks the forms and check_trt answers for
the same TensorRT (``gskit.plugin.target``). The replace step's own ``tensorrt`` option, where given, must
agree with it. Without either, the run's target is the installed TensorRT's version, else the newest gskit
knows.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gskit.errors import GskitError
from gskit.io.limits import check_integers

if TYPE_CHECKING:  # PyYAML loads where a recipe is read or written: the default recipe needs neither
    import yaml

#: A float as YAML 1.2 writes it; PyYAML (YAML 1.1) reads ``1e-5`` (no dot) as a string.
_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
#: Largest recipe file read; a recipe is a short list of steps.
MAX_RECIPE_BYTES = 1 << 20
#: Deepest nesting of lists and mappings in a recipe (``steps`` > step > options > a list of shapes).
MAX_RECIPE_DEPTH = 16
#: Most YAML nodes a recipe may expand to, aliases followed.
MAX_RECIPE_NODES = 100_000


@dataclass(frozen=True)
class RecipeStep:
    """One validated step: its name, its options object and where it was written."""

    name: str
    options: Any
    line: int | None = None


@dataclass(frozen=True)
class Recipe:
    """Validated steps, where they were read from, and the TensorRT version to prepare for.

    Attributes:
        steps: the steps in order.
        source: the file, ``default``, or ``<python>``; flags that changed it are appended.
        tensorrt: the target TensorRT version as written (``"10.3"``); None: the default target.
    """

    steps: tuple[RecipeStep, ...]
    source: str = "<default>"
    tensorrt: str | None = None

    @property
    def target(self) -> str | None:
        """The TensorRT version the recipe prepares for: its ``target``, else a step's own (replace's
        ``tensorrt``; ``parse_recipe`` checks they agree), else None (the default target)."""
        if self.tensorrt is not None:
            return self.tensorrt
        return next((v for s in self.steps if (v := getattr(s.options, "tensorrt", None)) is not None), None)

    def to_yaml(self) -> str:
        """The recipe as YAML with every option spelled out (what ``--print-default-recipe`` prints)."""
        import yaml

        entries = []
        for step in self.steps:
            options = dataclasses.asdict(step.options)
            entries.append({step.name: options} if options else step.name)
        head: dict[str, Any] = {"target": {"tensorrt": self.tensorrt}} if self.tensorrt is not None else {}
        return yaml.safe_dump({**head, "steps": entries}, sort_keys=False, default_flow_style=None)


def load_recipe(path: str | os.PathLike, registry: dict[str, type] | None = None) -> Recipe:
    """Read and validate a recipe file.

    Raises:
        GskitError: the file is missing or not YAML, or a step or option is unknown or of the wrong type
            (the message names the line).
    """
    path = Path(path)
    return parse_recipe(_read_recipe_text(path), source=str(path), registry=registry, base_dir=path.parent)


def _read_recipe_text(path: Path) -> str:
    """The recipe file's text: a regular file of at most ``MAX_RECIPE_BYTES`` of UTF-8.

    Opened without blocking and checked on the open file, so a FIFO, ``/dev/zero`` or a terminal is refused
    instead of read forever.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as err:
        raise GskitError(f"{path}: cannot read recipe: {err.strerror}") from err
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise GskitError(f"{path}: a recipe is a regular file (this is a device, folder or pipe)")
    with os.fdopen(fd, "rb") as file:
        try:
            data = file.read(MAX_RECIPE_BYTES + 1)
        except OSError as err:
            raise GskitError(f"{path}: cannot read recipe: {err.strerror}") from err
    if len(data) > MAX_RECIPE_BYTES:
        raise GskitError(
            f"{path}: recipe larger than {MAX_RECIPE_BYTES} bytes; a recipe is a short YAML list"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise GskitError(
            f"{path}: not a YAML recipe (byte {err.start} is not UTF-8 text; a binary file?)"
        ) from err


def _check_size(text: str, source: str) -> None:
    """Refuse YAML nested deeper than ``MAX_RECIPE_DEPTH``, from the event stream, before any node is built
    (composing nodes recurses once per level)."""
    import yaml

    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_RECIPE_DEPTH:
                raise GskitError(
                    f"{source}:{event.start_mark.line + 1}: nested more than {MAX_RECIPE_DEPTH} levels deep; "
                    "a recipe is a list of steps with flat options"
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _check_expansion(root: yaml.Node, source: str) -> None:
    """Refuse a node graph whose aliases expand past ``MAX_RECIPE_NODES`` nodes (counted with a budget, so
    the check itself stays cheap)."""
    import yaml

    budget = MAX_RECIPE_NODES
    pending: list[yaml.Node] = [root]
    while pending:
        node = pending.pop()
        budget -= 1
        if budget < 0:
            raise GskitError(
                f"{source}: expands to more than {MAX_RECIPE_NODES} values (YAML aliases?); "
                "write the steps out"
            )
        if isinstance(node, yaml.SequenceNode):
            pending.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                pending.extend((key, value))


def parse_recipe(
    text: str,
    *,
    source: str = "<recipe>",
    registry: dict[str, type] | None = None,
    base_dir: str | os.PathLike | None = None,
) -> Recipe:
    """Validate recipe text; ``registry`` maps step names to option dataclasses (default:
    gskit.pipeline.steps).

    ``base_dir``: where relative file options (fields with ``file_path`` metadata) resolve; None keeps
    them as written (relative to the working directory).

    Raises:
        GskitError: the text is not YAML, has no steps or a key twice, or a step or option is unknown or of
            the wrong type (the message names ``source`` and the line).
    """
    import yaml

    if registry is None:
        from gskit.pipeline.steps import STEP_OPTIONS

        registry = STEP_OPTIONS
    try:
        _check_size(text, source)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise GskitError(f"{where}: not valid YAML: {getattr(err, 'problem', err)}") from err
    if root is None:
        raise GskitError(f"{source}:1: empty recipe; it needs a 'steps:' list")
    _check_expansion(root, source)
    if not isinstance(root, yaml.MappingNode):
        raise GskitError(f"{_where(source, root)}: a recipe is a mapping with a 'steps:' list")
    top = _mapping(root, source)
    unknown = set(top) - {"steps", "target"}
    if unknown:
        raise GskitError(
            f"{_where(source, root)}: unknown top-level key(s) {sorted(unknown)}; only 'steps' and 'target'"
        )
    tensorrt = _target(top["target"], source) if "target" in top else None
    steps_node = top.get("steps")
    if not isinstance(steps_node, yaml.SequenceNode):
        raise GskitError(f"{_where(source, steps_node or root)}: 'steps' must be a list")
    if not steps_node.value:
        raise GskitError(f"{_where(source, steps_node)}: 'steps' is empty; list at least one step")
    base = Path(base_dir) if base_dir is not None else None
    steps = tuple(_parse_step(node, source, registry, base) for node in steps_node.value)
    _check_one_target(steps, tensorrt, source)
    recipe = Recipe(steps=steps, source=source, tensorrt=tensorrt)
    check_validation_order(recipe)
    return recipe


def _check_one_target(steps: tuple[RecipeStep, ...], tensorrt: str | None, source: str) -> None:
    """A run has one target: a step's own ``tensorrt`` option (replace's) must agree with the recipe's and
    with the other steps'."""
    from gskit.plugin.target import TensorRTTarget

    seen = [] if tensorrt is None else [("the recipe's target", TensorRTTarget.parse(tensorrt, ""))]
    for step in steps:
        value = getattr(step.options, "tensorrt", None)
        if value is None:
            continue
        version = TensorRTTarget.parse(value, "")
        if seen and seen[0][1] != version:
            raise GskitError(
                f"{source}:{step.line}: step '{step.name}' asks for TensorRT {value}, {seen[0][0]} is "
                f"{seen[0][1]}; a run prepares for one TensorRT: give it once, at the top "
                f'(target: {{tensorrt: "{value}"}})'
            )
        seen.append((f"step '{step.name}' (line {step.line})", version))


def _target(node: yaml.Node, source: str) -> str:
    """The version of ``target: {tensorrt: VERSION}``, checked (``gskit.plugin.target``)."""
    import yaml

    from gskit.plugin.target import TensorRTTarget

    if not isinstance(node, yaml.MappingNode):
        raise GskitError(f'{_where(source, node)}: target is a mapping: target: {{tensorrt: "10.3"}}')
    entries = _mapping(node, source)
    unknown = sorted(set(entries) - {"tensorrt"})
    if unknown or "tensorrt" not in entries:
        raise GskitError(
            f'{_where(source, node)}: target takes one key, tensorrt (target: {{tensorrt: "10.3"}}); '
            f"got {sorted(entries)}"
        )
    value_node = entries["tensorrt"]
    value = yaml.safe_load(yaml.serialize(value_node))
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise GskitError(
            f'{_where(source, value_node)}: target.tensorrt is a version like "10.3", got {value!r}'
        )
    try:
        TensorRTTarget.parse(value)
    except GskitError as err:
        raise GskitError(f"{_where(source, value_node)}: target.tensorrt: {err}") from err
    return str(value)


def check_validation_order(recipe: Recipe) -> None:
    """Refuse a step that changes the model after the last ``validate``: a validation describes the model
    that is written, or nothing.

    Refused rather than validated again at the end: a silent second validation would hide that the recipe
    says something else than what runs, and its tolerances, inputs and seed would have to be guessed.
    A recipe without ``validate`` is allowed; ``gskit prepare`` then says "not validated".

    Raises:
        GskitError: naming the changing step and the validate step, with their lines.
    """
    from gskit.pipeline.steps import PASSES

    last = max((i for i, step in enumerate(recipe.steps) if step.name == "validate"), default=None)
    if last is None:
        return
    for index in range(last + 1, len(recipe.steps)):
        step = recipe.steps[index]
        if step.name in PASSES and PASSES[step.name].effect != "analysis":
            raise GskitError(
                f"{_step_where(recipe, index)}: step '{step.name}' changes the model after step 'validate' "
                f"({_step_where(recipe, last, line_only=True)}), so the validation would not describe the "
                f"written model; put 'validate' after '{step.name}'"
            )


def _step_where(recipe: Recipe, index: int, *, line_only: bool = False) -> str:
    """``recipe.yaml:4`` (or ``line 4``); ``step 3`` for a step that was not read from text."""
    line = recipe.steps[index].line
    where = f"line {line}" if line is not None else f"step {index + 1}"
    if line_only:
        return where
    return f"{recipe.source}:{line}" if line is not None else f"{recipe.source}: {where}"


def make_recipe(
    entries: list[tuple[str, dict[str, Any]]],
    registry: dict[str, type] | None = None,
    *,
    tensorrt: str | None = None,
) -> Recipe:
    """A recipe from Python: ``[("fold", {"max_passes": 3}), ("validate", {})]``, validated the same way;
    ``tensorrt``: the target TensorRT version (``"10.3"``)."""
    if tensorrt is None and not any(options for _, options in entries):
        plain = _without_options([name for name, _ in entries], registry)
        if plain is not None:
            return plain
    import yaml

    head = {"target": {"tensorrt": tensorrt}} if tensorrt is not None else {}
    steps = [{name: options} for name, options in entries]
    text = yaml.safe_dump({**head, "steps": steps}, sort_keys=False)
    return parse_recipe(text, source="<python>", registry=registry)


def _without_options(names: list[str], registry: dict[str, type] | None) -> Recipe | None:
    """The recipe :func:`make_recipe` reads from the YAML it writes for steps without options (``steps:`` on
    line 1, the Nth step on line N + 1), made without writing and reading YAML (the default recipe: PyYAML's
    import and the round trip were 20-30 ms of every ``gskit prepare``). None where the YAML's reading would
    fail (no step, an unknown one, options refusing their defaults): it then says why."""
    if registry is None:
        from gskit.pipeline.steps import STEP_OPTIONS

        registry = STEP_OPTIONS
    if not names or any(name not in registry for name in names):
        return None
    try:
        steps = tuple(RecipeStep(name, registry[name](), line=i + 2) for i, name in enumerate(names))
    except (TypeError, ValueError, GskitError):
        return None
    _check_one_target(steps, None, "<python>")
    recipe = Recipe(steps=steps, source="<python>")
    check_validation_order(recipe)
    return recipe


def _parse_step(node: yaml.Node, source: str, registry: dict[str, type], base: Path | None) -> RecipeStep:
    import yaml

    if isinstance(node, yaml.ScalarNode):
        name, options_node = node.value, None
    elif isinstance(node, yaml.MappingNode) and len(node.value) == 1:
        key, options_node = node.value[0]
        name = _scalar_key(key, source)
    else:
        raise GskitError(f"{_where(source, node)}: a step is a name or 'name: {{options}}'")
    if name not in registry:
        raise GskitError(f"{_where(source, node)}: unknown step '{name}'; known steps: {', '.join(registry)}")
    cls = registry[name]
    values: dict[str, Any] = {}
    if options_node is not None and not (
        isinstance(options_node, yaml.ScalarNode) and options_node.value in ("", "~", "null")
    ):
        if not isinstance(options_node, yaml.MappingNode):
            raise GskitError(f"{_where(source, options_node)}: options of step '{name}' must be a mapping")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        hints = typing.get_type_hints(cls)
        for option, (key_node, value_node) in _mapping(options_node, source, keep_nodes=True).items():
            refused = getattr(cls, "refused", lambda: {})()
            if option in refused:
                raise GskitError(f"{_where(source, key_node)}: {name}.{option}: {refused[option]}")
            if option not in fields:
                raise GskitError(
                    f"{_where(source, key_node)}: step '{name}' has no option '{option}'; "
                    f"options: {', '.join(fields) or '(none)'}"
                )
            try:
                value = yaml.safe_load(yaml.serialize(value_node))
            except yaml.YAMLError as err:
                raise GskitError(
                    f"{_where(source, value_node)}: {name}.{option}: cannot read the value: "
                    f"{getattr(err, 'problem', err)}"
                ) from err
            where = f"{_where(source, value_node)}: {name}.{option}"
            check_integers(value, where)  # one rule for every option: no 400-digit dim, seed or attribute
            value = _check_type(value, hints[option], where)
            if base is not None and fields[option].metadata.get("file_path") and isinstance(value, str):
                value = str(base / value)  # an absolute value stays as it is
            values[option] = value
    try:
        options = cls(**values)
    except (TypeError, ValueError, GskitError) as err:
        raise GskitError(f"{_where(source, node)}: step '{name}': {err}") from err
    return RecipeStep(name=name, options=options, line=node.start_mark.line + 1)


def _where(source: str, node: yaml.Node) -> str:
    return f"{source}:{node.start_mark.line + 1}"


def _scalar_key(node: yaml.Node, source: str) -> str:
    import yaml

    if not isinstance(node, yaml.ScalarNode):
        raise GskitError(f"{_where(source, node)}: a key must be a plain name, not a list or mapping")
    return node.value


def _mapping(node: yaml.MappingNode, source: str, *, keep_nodes: bool = False) -> dict[str, Any]:
    """A mapping node's entries by key: value nodes, or (key, value) node pairs. Duplicate keys are errors."""
    entries: dict[str, Any] = {}
    for key_node, value_node in node.value:
        key = _scalar_key(key_node, source)
        if key in entries:
            raise GskitError(f"{_where(source, key_node)}: '{key}' is given twice")
        entries[key] = (key_node, value_node) if keep_nodes else value_node
    return entries


def _check_type(value: Any, hint: Any, where: str) -> Any:
    """Check a YAML value against a dataclass field's annotation; return it (tuples for sequences)."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        for option in args:
            try:
                return _check_type(value, option, where)
            except GskitError:
                continue
        raise GskitError(f"{where}: {value!r} is not {_type_name(hint)}")
    if hint is type(None):
        if value is None:
            return None
        raise GskitError(f"{where}: expected nothing, got {value!r}")
    if origin is typing.Literal:
        if value in args:
            return value
        raise GskitError(f"{where}: {value!r} is not one of {', '.join(map(repr, args))}")
    if origin in (tuple, list) or hint in (tuple, list):
        if not isinstance(value, list):
            raise GskitError(f"{where}: expected a list, got {value!r}")
        item = args[0] if args else Any
        return tuple(_check_type(v, item, where) for v in value)
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise GskitError(f"{where}: expected a mapping, got {value!r}")
        key_t, val_t = args if args else (Any, Any)
        return {_check_type(k, key_t, where): _check_type(v, val_t, where) for k, v in value.items()}
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is float and isinstance(value, str) and _FLOAT.fullmatch(value):
        return float(value)
    if hint is bool and not isinstance(value, bool):
        raise GskitError(f"{where}: expected true or false, got {value!r}")
    if isinstance(hint, type) and not isinstance(value, hint):
        raise GskitError(f"{where}: expected {_type_name(hint)}, got {value!r}")
    if hint is int and isinstance(value, bool):
        raise GskitError(f"{where}: expected an integer, got {value!r}")
    return value


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
