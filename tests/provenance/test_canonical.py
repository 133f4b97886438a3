"""Canonical JSON of what is signed: a NaN or an infinity anywhere is refused by its JSON pointer."""

from __future__ import annotations

import json
import math

import pytest

from shardport.provenance.canonical import canonical_bytes, finite_text, nonfinite_paths
from shardport.provenance.errors import NonFiniteNumberError
from shardport.provenance.statement import Statement, Subject


def test_every_non_finite_float_is_named_by_its_pointer() -> None:
    doc = {"a": [1.0, math.nan, {"b/c": -math.inf}], "ok": 2, "t": (math.inf,), "s": "NaN"}
    assert nonfinite_paths(doc) == ["/a/1", "/a/2/b~1c", "/t/0"]
    assert nonfinite_paths({"x": [0.5, 1e308, -0.0, True, None]}) == []


def test_a_statement_with_a_nan_predicate_is_refused_before_it_is_signed() -> None:
    statement = Statement(
        subjects=(Subject(name="llama/q@sha256:" + "ab" * 32, sha256="ab" * 32),),
        predicate_type="https://shardport.dev/evidence/v1",
        predicate={"parity": [{"value": math.nan}], "passed": True},
    )
    with pytest.raises(NonFiniteNumberError) as caught:
        statement.to_bytes()
    assert caught.value.paths == ["/predicate/parity/0/value"]
    assert caught.value.exit_code == 2 and "/predicate/parity/0/value" in str(caught.value)


def test_finite_text_writes_what_json_and_javascript_read_back() -> None:
    written = finite_text({"n": math.nan, "p": math.inf, "m": [-math.inf, 1.5], "t": (1,)})
    assert written == {"n": "NaN", "p": "Infinity", "m": ["-Infinity", 1.5], "t": [1]}
    assert math.isnan(float(written["n"])) and float(written["m"][0]) == -math.inf
    assert json.loads(canonical_bytes(written)) == written
