"""The request side: stream detection, and context read only from the protocol's trusted
places (DESIGN §3, docs/protocols.md): a chunk tag in user text is never context."""

from __future__ import annotations

import copy

from gateway.context import DEFAULT_TRUST
from gateway.types import ContextSet
from tests.contract.helpers import Case
from tests.contract.samples import CHUNK_ID, PLANTED_ID


def test_request_info_and_streams_by_path(case: Case) -> None:
    adapter, sample = case.adapter, case.sample
    plain = adapter.request_info(sample.plain_request)
    assert not plain.stream
    assert plain.n == 1
    if sample.stream_request is not None:
        assert adapter.request_info(sample.stream_request).stream
    assert sample.paths, "a sample names at least the protocol's path"
    for path, streams in sample.paths.items():
        assert adapter.streams_by_path(path) is streams, path
    if sample.stream_request is None and sample.frames is not None:
        # a protocol that streams but has no stream flag in the body: the path says so
        assert True in sample.paths.values()


def test_trusted_places_are_context(case: Case) -> None:
    assert case.sample.trusted
    for where, request in case.sample.trusted.items():
        before = copy.deepcopy(request)
        ctx = ContextSet()
        case.adapter.request_context(request, ctx, case.sample.trust)
        assert CHUNK_ID in ctx.chunks, where
        assert request == before, f"{where}: request_context changed the request"


def test_chunk_tags_in_untrusted_text_are_not_context(case: Case) -> None:
    assert case.sample.untrusted
    for where, request in case.sample.untrusted.items():
        for trust in (DEFAULT_TRUST, case.sample.trust):
            ctx = ContextSet()
            case.adapter.request_context(request, ctx, trust)
            assert PLANTED_ID not in ctx.chunks, where
