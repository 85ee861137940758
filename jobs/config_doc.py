"""Write docs/CONFIG.md from the pydantic config models, so the reference never drifts.

    python -m jobs.config_doc            # rewrite docs/CONFIG.md
    python -m jobs.config_doc --check    # exit 1 if it is stale (a test runs this)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel

from jobs.config import RunConfig

OUT = Path(__file__).resolve().parent.parent / "docs" / "CONFIG.md"
HEADER = """# Config reference

Generated from `jobs/config.py` and `contract/config.py` by `python -m jobs.config_doc`.
A run is one YAML file with four sections; unknown keys are errors. Override any key on
the command line: `--set job.max_new_tokens=8192`.
"""


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _default(field) -> str:
    if field.is_required():
        return "**required**"
    if field.default_factory is not None:
        value = field.default_factory()
        return "(section)" if isinstance(value, BaseModel) else f"`{value!r}`"
    return f"`{field.default!r}`"


def _plain(annotation: Any) -> Any:
    """The type without its Annotated validators (extra_args' keys and values carry some)."""
    if get_origin(annotation) is Annotated:
        return _plain(get_args(annotation)[0])
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (dict, list, tuple, Union):
        return origin[tuple(_plain(a) for a in args)]
    return annotation


def _forms(annotation: Any) -> list[tuple[type[BaseModel], bool]]:
    """(model, as a list's item) of each form a "one or a list" field takes
    (job.sampling: a setting or a mix of them); [] for any other field."""
    plain = _plain(annotation)
    if get_origin(plain) is not Union:
        return []
    out = []
    for arg in get_args(plain):
        if _is_model(arg):
            out.append((arg, False))
        elif get_origin(arg) is list and _is_model(get_args(arg)[0]):
            out.append((get_args(arg)[0], True))
    return out if len(out) == len(get_args(plain)) else []


def _form_rows(field, key: str, forms: list[tuple[type[BaseModel], bool]]) -> list[str]:
    """The field's own row, then each form's keys: the mapping's under ``key``, a list
    item's own (those the mapping lacks) under ``key[]``."""
    desc = (field.description or "").replace("\n", " ")
    rows = [f"| `{key}` | mapping or list | (section) | {desc} |"]
    seen: set[str] = set()
    for model, listed in forms:
        rows += [r for r in _rows(model, f"{key}[]" if listed else key)
                 if not listed or r.split("`")[1].rsplit(".", 1)[1] not in seen]
        seen |= set(model.model_fields)
    return rows


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows, nested = [], []
    for name, field in model.model_fields.items():
        key = f"{prefix}.{name}" if prefix else name
        if _is_model(field.annotation):
            nested.append((field.annotation, key))
            continue
        forms = _forms(field.annotation)
        if forms:
            rows += _form_rows(field, key, forms)
            continue
        ann = _plain(field.annotation)
        kind = ann.__name__ if isinstance(ann, type) else repr(ann).replace("typing.", "")
        kind = kind.replace("|", "\\|")
        desc = (field.description or "").replace("\n", " ")
        rows.append(f"| `{key}` | {kind} | {_default(field)} | {desc} |")
        optional = [a for a in get_args(ann) if _is_model(a)] if get_origin(ann) is Union else []
        if len(optional) == 1:  # an optional section (null = off): its keys too
            nested.append((optional[0], key))
    for sub, key in nested:
        rows += _rows(sub, key)
    return rows


def _variants(annotation: Any) -> list[type[BaseModel]]:
    """The model a section holds, or each member of a union (the engine kinds)."""
    if _is_model(annotation):
        return [annotation]
    return [get_args(a)[0] if get_origin(a) is Annotated else a for a in get_args(annotation)]


def render() -> str:
    parts = [HEADER]
    for section, field in RunConfig.model_fields.items():
        for model in _variants(field.annotation):
            kind = model.model_fields.get("kind")
            title = f"`{section}`"
            if kind is not None:
                title += f" with `kind: {get_args(kind.annotation)[0]}`"
            parts.append(f"\n## {title}\n\n{(model.__doc__ or '').strip()}\n")
            parts.append("| key | type | default | meaning |\n|---|---|---|---|")
            parts += _rows(model, section)
    return "\n".join(parts) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is stale: run python -m jobs.config_doc", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
