"""The typed results cannot drift from the server: each dataclass has exactly the properties
of the OpenAPI schema it mirrors."""

from __future__ import annotations

import dataclasses

import httpx
import pytest

import abridge_memory._models as m
from conftest import Server

MODELS = [
    v for v in vars(m).values()
    if isinstance(v, type) and dataclasses.is_dataclass(v) and hasattr(v, "SCHEMA")
]


def test_every_result_type_matches_its_schema(server: Server) -> None:
    doc = httpx.get(f"{server.url}/openapi.json").json()
    schemas = doc["components"]["schemas"]
    assert len(MODELS) >= 15
    for cls in MODELS:
        schema = schemas.get(cls.SCHEMA)
        assert schema is not None, f"{cls.__name__}: no schema {cls.SCHEMA}"
        fields = {f.name for f in dataclasses.fields(cls)}
        props = set(schema.get("properties", {}))
        assert fields == props, f"{cls.__name__} vs {cls.SCHEMA}: missing {props - fields}, extra {fields - props}"
        required = set(schema.get("required", []))
        optional = {f.name for f in dataclasses.fields(cls)
                    if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
        assert not (required & optional), (
            f"{cls.__name__}: required by the server but defaulted here: {required & optional}"
        )
