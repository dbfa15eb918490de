"""A ``CatalogSpec`` as JSON and back, so a seed task carries the exact call it was validated
with and a composer can rebuild (and re-derive) it without re-running the library adapter.

``Code`` literals (``torch.float32``) are tagged so they stay code; tuples are tagged so shapes
and tuple-valued arguments come back as tuples. ``evidence`` and ``code`` are left out: the
first is already in the seed's meta, the second is the task itself.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from opsynth.synth.catalog.spec import CatalogSpec, Code, InputSpec


def _encode(value: Any) -> Any:
    if isinstance(value, Code):
        return {"code": str(value)}
    if isinstance(value, tuple):
        return {"tuple": [_encode(v) for v in value]}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {"dict": [[k, _encode(v)] for k, v in value.items()]}
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if "code" in value:
            return Code(value["code"])
        if "tuple" in value:
            return tuple(_decode(v) for v in value["tuple"])
        if "dict" in value:
            return {k: _decode(v) for k, v in value["dict"]}
        raise ValueError(f"unknown encoded value {value!r}")
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def spec_to_json(spec: CatalogSpec) -> dict[str, Any]:
    args = [{f.name: _encode(getattr(a, f.name)) for f in fields(InputSpec)} for a in spec.args]
    return {
        "library": spec.library,
        "name": spec.name,
        "kind": spec.kind,
        "target": spec.target,
        "init": [[k, _encode(v)] for k, v in spec.init],
        "init_kwargs": [[k, _encode(v)] for k, v in spec.init_kwargs],
        "args": args,
        "flags": list(spec.flags),
        "data_source": spec.data_source,
        "family": spec.family,
    }


def spec_from_json(data: dict[str, Any]) -> CatalogSpec:
    args = tuple(InputSpec(**{k: _decode(v) for k, v in a.items()}) for a in data["args"])
    return CatalogSpec(
        library=data["library"],
        name=data["name"],
        kind=data["kind"],
        target=data.get("target", ""),
        init=tuple((k, _decode(v)) for k, v in data.get("init", [])),
        init_kwargs=tuple((k, _decode(v)) for k, v in data.get("init_kwargs", [])),
        args=args,
        flags=tuple(data.get("flags", [])),
        data_source=data.get("data_source", ""),
        family=data.get("family", ""),
    )
