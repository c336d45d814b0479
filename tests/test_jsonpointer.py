from __future__ import annotations

import pytest

from gateway.jsonpointer import MISSING, parse, resolve

DOC = {
    "foo": ["bar", "baz"],
    "": 0,
    "a/b": 1,
    "m~n": 8,
    "~1": 9,
    "n": None,
    "deep": {"list": [{"id": "x"}]},
}


@pytest.mark.parametrize(
    ("pointer", "expected"),
    [
        ("", DOC),
        ("/foo", ["bar", "baz"]),
        ("/foo/0", "bar"),
        ("/foo/1", "baz"),
        ("/", 0),
        ("/a~1b", 1),
        ("/m~0n", 8),
        ("/~01", 9),
        ("/n", None),
        ("/deep/list/0/id", "x"),
    ],
)
def test_rfc6901_examples(pointer: str, expected: object) -> None:
    assert resolve(DOC, pointer) == expected


@pytest.mark.parametrize(
    "pointer", ["/nope", "/foo/2", "/foo/-", "/foo/01", "/foo/x", "/n/x", "/foo/0/x"]
)
def test_missing_paths(pointer: str) -> None:
    assert resolve(DOC, pointer) is MISSING
    assert not MISSING


def test_null_is_not_missing() -> None:
    assert resolve(DOC, "/n") is None


@pytest.mark.parametrize("pointer", ["foo", "/a~2b", "/a~"])
def test_invalid_pointers(pointer: str) -> None:
    with pytest.raises(ValueError):
        parse(pointer)


def test_token_sequence() -> None:
    assert resolve(DOC, ("a/b",)) == 1
