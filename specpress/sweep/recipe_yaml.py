"""Reading a recipe's YAML safely, before anything is built from it (sweep/recipe.py validates what it holds).

`yaml.safe_load` runs no code, but a few lines of YAML can still stand for gigabytes: aliases (`*name`)
share nodes, so nine levels of nine aliases are 9^9 values once expanded (the "billion laughs"), and
printing or hashing such a recipe never ends. `read_recipe_yaml` refuses a file over MAX_RECIPE_BYTES,
a node graph that expands past MAX_RECIPE_NODES values or nests deeper than MAX_RECIPE_DEPTH (counted on
the composed graph, before it is built into Python objects), an alias that contains itself, a key given
twice in one mapping, and strings no path can hold (a NUL; the lone surrogates YAML's `\\ud800` escapes make).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specpress.errors import ConfigError


def _strict_loader() -> Any:
    """yaml.SafeLoader that refuses a key given twice in one mapping (plain YAML keeps the last silently)."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        pass

    def mapping(loader: Any, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool, type(None))):
                continue  # construct_mapping says what is wrong with such a key
            if key in seen:
                raise ConfigError(f"line {key_node.start_mark.line + 1}: key {key!r} is given twice in the same "
                                  f"mapping; keep one")
            seen.add(key)
        return loader.construct_mapping(node, deep=deep)

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return StrictLoader


MAX_RECIPE_BYTES = 1 << 20  # a recipe is a page of YAML
MAX_RECIPE_NODES = 100_000  # values a recipe holds once YAML aliases are expanded (a real one: < 1,000)
MAX_RECIPE_DEPTH = 32


def _expanded_size(node: Any, source: Path) -> int:
    """How many values the YAML node graph `node` holds with every alias expanded (aliases share nodes, so
    a few lines can stand for gigabytes: the 'billion laughs'); refused past MAX_RECIPE_NODES, past
    MAX_RECIPE_DEPTH levels, or when an alias contains itself. Memoized per node: linear in the file."""
    import yaml

    sizes: dict[int, int] = {}
    stack: list[tuple[Any, int, bool]] = [(node, 1, False)]  # (node, depth, children counted)
    open_nodes: set[int] = set()
    while stack:
        n, depth, done = stack.pop()
        kids = [v for pair in n.value for v in pair] if isinstance(n, yaml.MappingNode) else \
            list(n.value) if isinstance(n, yaml.SequenceNode) else []
        if done:
            open_nodes.discard(id(n))
            sizes[id(n)] = min(1 + sum(sizes[id(k)] for k in kids), MAX_RECIPE_NODES + 1)
            if sizes[id(n)] > MAX_RECIPE_NODES:
                raise ConfigError(f"{source}: the recipe expands to more than {MAX_RECIPE_NODES:,} values once its "
                                  f"YAML aliases (*name) are expanded; a recipe is a page of settings, not a data "
                                  f"file: write it without aliases that multiply")
            continue
        if id(n) in sizes:
            continue
        if id(n) in open_nodes:
            raise ConfigError(f"{source}: a YAML alias contains itself (line {n.start_mark.line + 1}); remove it")
        if depth > MAX_RECIPE_DEPTH:
            raise ConfigError(f"{source}: nested more than {MAX_RECIPE_DEPTH} levels deep (line "
                              f"{n.start_mark.line + 1}); a recipe is a few levels deep")
        open_nodes.add(id(n))
        stack.append((n, depth, True))
        stack.extend((k, depth + 1, False) for k in kids if id(k) not in sizes)
    return sizes[id(node)]


def _check_text(obj: Any, source: Path) -> None:
    """Every string of the recipe is text a path or a name can hold: no NUL, no lone surrogate (YAML's
    "\ud800" escapes make them)."""
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, dict):
            stack += [*o.keys(), *o.values()]
        elif isinstance(o, list):
            stack += o
        elif isinstance(o, str):
            if "\0" in o:
                raise ConfigError(f"{source}: the value {o!r:.60} holds a NUL character, which no path or name can "
                                  f"hold; remove it")
            try:
                o.encode("utf-8")
            except UnicodeEncodeError:
                raise ConfigError(f"{source}: the value {o!r:.60} holds an escaped surrogate (\\ud800-\\udfff), "
                                  f"not a character; write the character itself") from None


def read_recipe_yaml(path: Path) -> Any:
    """The object the YAML file `path` holds (None when it is empty), checked as the module docstring says."""
    import yaml

    from specpress.readback import fmt_bytes, regular_file

    size = regular_file(path, ConfigError)
    if size > MAX_RECIPE_BYTES:
        raise ConfigError(f"{path} is {fmt_bytes(size)}; a recipe is at most {fmt_bytes(MAX_RECIPE_BYTES)} of YAML")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
                          f"save the recipe as UTF-8") from None
    loader = None
    try:
        loader = _strict_loader()(text)
        node = loader.get_single_node()
        if node is not None:
            _expanded_size(node, path)
        obj = None if node is None else loader.construct_document(node)
        _check_text(obj, path)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested more than {MAX_RECIPE_DEPTH} levels deep; a recipe is a few levels "
                          f"deep") from None
    except ConfigError as exc:
        raise ConfigError(str(exc) if str(exc).startswith(str(path)) else f"{path}: {exc}") from None
    finally:
        if loader is not None:
            loader.dispose()
    return obj
