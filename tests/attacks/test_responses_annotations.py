"""openai-responses annotations (DESIGN §2, "Every field is decided"): every string an
annotation carries has a shape (a file or container id, a URL, a file name), so none can carry
a sentence nobody verified; and in progressive release the annotations that go out are those
of the claims that went out, of the part the verifier followed, in every mode."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from gateway.demo import responses_wire as rw
from tests.attacks.conftest import run_case
from tests.attacks.harness import MARKER, GatewayProcess, RawResponse, assert_no_leak
from tests.attacks.protocols import BAD, GOOD, Mode
from tests.attacks.responses_spec import ID, MSG, RESPONSES, events, framed
from tests.upstream_app import SCENARIO_HEADER, FakeUpstream, Json, Stream, sse_events

Obj = dict[str, Any]
MODES: list[Mode] = ["json", "buffer", "progressive"]
SENTENCE = f"the {MARKER} sentence that is not verified"
# A sentence with no spaces in it: a plain token shape would pass it.
JOINED = f"the_{MARKER}_sentence_that_is_not_verified"


def _body(text: str, anns: list[Obj]) -> Obj:
    return rw.response_body([rw.message_item(text, id=MSG, annotations=anns)], id=ID,
                            model="fake-model")


def _behaviour(b: Obj, mode: Mode) -> Json | Stream:
    if mode == "json":
        return Json(b)
    return Stream(framed(events(b)), seed=7, max_piece=256, delay=0.0)


def _data(resp: RawResponse) -> list[Any]:
    return [json.loads(d) for _, d in sse_events(resp.body)]


def _final(resp: RawResponse, mode: Mode) -> Any:
    if mode == "json":
        return resp.json()
    return next(e["response"] for e in _data(resp) if e.get("type") == "response.completed")


def _final_annotations(resp: RawResponse, mode: Mode) -> list[Obj]:
    return [a for item in _final(resp, mode)["output"] if item["type"] == "message"
            for p in item["content"] for a in p.get("annotations") or []]


# -- F1: every annotation string has a shape ---------------------------------------------------

_END = len(GOOD)
PLANTED: dict[str, Obj] = {
    "file_path-file_id-sentence": {"type": "file_path", "file_id": SENTENCE, "index": _END},
    "file_path-file_id-joined": {"type": "file_path", "file_id": JOINED, "index": _END},
    "container-id-sentence": {"type": "container_file_citation", "container_id": SENTENCE,
                              "file_id": "kb:1", "filename": "pump.txt", "start_index": 0,
                              "end_index": _END},
    "container-id-joined": {"type": "container_file_citation", "container_id": JOINED,
                            "file_id": "kb:1", "filename": "pump.txt", "start_index": 0,
                            "end_index": _END},
    "file_citation-filename": {"type": "file_citation", "file_id": "kb:1", "filename": SENTENCE,
                               "index": _END},
    "url-with-spaces": {"type": "url_citation", "url": f"https://example.com/{SENTENCE}",
                        "title": "Pump", "start_index": 0, "end_index": _END},
    "url-title": {"type": "url_citation", "url": "https://example.com/pump", "title": SENTENCE,
                  "start_index": 0, "end_index": _END},
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(PLANTED))
def test_annotation_strings_carry_no_sentence(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], mode: Mode, name: str
) -> None:
    ann = copy.deepcopy(PLANTED[name])
    resp = run_case(gateway, upstream, RESPONSES, mode, _behaviour(_body(GOOD, [ann]), mode))
    assert resp.status != 500, resp.raw[:800]
    assert_no_leak(resp)


@pytest.mark.parametrize("mode", MODES)
def test_annotation_ids_of_the_providers_shape_go_out(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], mode: Mode
) -> None:
    """The positive control: a file_path and a container file citation with the API's own id
    shapes are released as they came."""
    anns = [
        {"type": "container_file_citation", "container_id": "cntr_682e0e7318108198aa783fd9",
         "file_id": "kb:1", "filename": "pump.csv", "start_index": 0, "end_index": _END},
        {"type": "file_path", "file_id": "cfile_682e0e8a43c88191a7978f477a09bdf5",
         "index": _END},
        {"type": "file_path", "file_id": "file-2dtbBZxA7r8WZyYdKU8NqG", "index": _END},
    ]
    resp = run_case(gateway, upstream, RESPONSES, mode,
                    _behaviour(_body(GOOD, copy.deepcopy(anns)), mode))
    assert resp.status == 200, resp.raw[:800]
    assert resp.header("x-citewarden-decision") in ("released", "progressive"), resp.body[:800]
    assert RESPONSES.answer_text(resp) == GOOD
    assert _final_annotations(resp, mode) == anns


# -- F2: progressive release keeps the annotations of the claims that went out -----------------

_BAD_AT = len(GOOD) + 1
_BAD_END = _BAD_AT + len(BAD)
ON_FAILING: dict[str, Obj] = {
    "url": {"type": "url_citation", "url": f"https://example.com/{MARKER}", "title": "Pump",
            "start_index": _BAD_AT, "end_index": _BAD_END},
    "title": {"type": "url_citation", "url": "https://example.com/pump", "title": MARKER,
              "start_index": _BAD_AT, "end_index": _BAD_END},
    "file_id": {"type": "file_citation", "file_id": f"kb:{MARKER}", "filename": "pump.txt",
                "index": _BAD_END},
    "filename": {"type": "file_citation", "file_id": "kb:1", "filename": f"{MARKER}.txt",
                 "index": _BAD_END},
    "file_path": {"type": "file_path", "file_id": f"file-{MARKER}", "index": _BAD_END},
    "container": {"type": "container_file_citation", "container_id": f"cntr_{MARKER}",
                  "file_id": "kb:1", "filename": "pump.csv", "start_index": _BAD_AT,
                  "end_index": _BAD_END},
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(ON_FAILING))
def test_a_failing_claims_annotation_goes_with_it(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], mode: Mode, name: str
) -> None:
    ann = copy.deepcopy(ON_FAILING[name])
    b = _body(f"{GOOD} {BAD}", [ann])
    resp = run_case(gateway, upstream, RESPONSES, mode, _behaviour(b, mode))
    assert resp.status == 200, resp.raw[:800]
    assert_no_leak(resp)
    assert RESPONSES.answer_text(resp).startswith(GOOD)


def _inline_part_events(first: str, second: str, second_anns: list[Obj]) -> list[Obj]:
    """A message whose first output_text part comes inside output_item.added (no
    content_part.added), and a second part announced before the first one's text."""
    b = rw.response_body([rw.message_item(first, id=MSG)], id=ID, model="fake-model")
    evs = events(b)
    added = next(e for e in evs if e["type"] == "response.output_item.added")
    added["item"]["content"] = [
        {"type": "output_text", "text": "", "annotations": [], "logprobs": []}]
    evs = [e for e in evs if e["type"] != "response.content_part.added"]
    # The second part: added, its text, its annotations, done; then the item's done repeats it.
    base = {"item_id": MSG, "output_index": 0, "content_index": 1}
    part = {"type": "output_text", "text": second, "annotations": second_anns, "logprobs": []}
    announce = {"sequence_number": 0, "type": "response.content_part.added", **base,
                "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}
    evs.insert(evs.index(added) + 1, announce)
    extra: list[Obj] = [
        {"type": "response.output_text.delta", **base, "delta": second, "logprobs": []},
        *({"type": "response.output_text.annotation.added", **base, "annotation_index": k,
           "annotation": a} for k, a in enumerate(second_anns)),
        {"type": "response.output_text.done", **base, "text": second, "logprobs": []},
        {"type": "response.content_part.done", **base, "part": part},
    ]
    at = next(k for k, e in enumerate(evs) if e["type"] == "response.output_item.done")
    evs[at:at] = [{"sequence_number": 0, **e} for e in extra]
    for e in evs:
        if e["type"] in ("response.output_item.done",):
            e["item"]["content"].append(copy.deepcopy(part))
        if e["type"] == "response.completed":
            e["response"]["output"][0]["content"].append(copy.deepcopy(part))
    return evs


def test_progressive_follows_the_part_the_verifier_follows(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream]
) -> None:
    """The first output_text part, announced inside its item (no content_part.added): its
    verified claims go out as its own deltas, and a second part's annotations (of a claim that
    fails) are never laid over them."""
    second = "The Orbit pump was designed by someone in 1931 [kb:404]."
    ann = {"type": "url_citation", "url": f"https://example.com/{MARKER}", "title": "Pump",
           "start_index": 0, "end_index": 10}
    evs = _inline_part_events(f"{GOOD} {BAD}", second, [ann])
    resp = run_case(gateway, upstream, RESPONSES, "progressive",
                    Stream(framed(evs), seed=7, max_piece=256, delay=0.0))
    assert resp.status == 200, resp.raw[:800]
    assert_no_leak(resp)
    data = _data(resp)
    deltas = [e for e in data if e["type"] == "response.output_text.delta"]
    first = "".join(e["delta"] for e in deltas if e["content_index"] == 0)
    assert first.startswith(GOOD), data
    # The first part's claims went out as they verified, before the second part's text.
    assert [e["content_index"] for e in deltas] == sorted(e["content_index"] for e in deltas)
    final = next(e["response"] for e in data if e["type"] == "response.completed")
    messages = [i for i in final["output"] if i["type"] == "message"]
    assert len(messages) == 1, final["output"]
    assert messages[0]["content"][0]["text"] == first
    assert messages[0]["content"][0]["annotations"] == []


def test_progressive_inline_part_alone_streams_as_it_verifies(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream]
) -> None:
    """Only an inline part: the answer goes out as deltas of that part, once."""
    b = rw.response_body([rw.message_item(GOOD, id=MSG)], id=ID, model="fake-model")
    evs = events(b)
    added = next(e for e in evs if e["type"] == "response.output_item.added")
    added["item"]["content"] = [
        {"type": "output_text", "text": "", "annotations": [], "logprobs": []}]
    evs = [e for e in evs if e["type"] != "response.content_part.added"]
    resp = run_case(gateway, upstream, RESPONSES, "progressive",
                    Stream(framed(evs), seed=7, max_piece=256, delay=0.0))
    assert resp.status == 200, resp.raw[:800]
    data = _data(resp)
    deltas = [e for e in data if e["type"] == "response.output_text.delta"]
    assert "".join(e["delta"] for e in deltas) == GOOD
    assert {(e["output_index"], e["content_index"]) for e in deltas} == {(0, 0)}
    final = next(e["response"] for e in data if e["type"] == "response.completed")
    assert [i["content"][0]["text"] for i in final["output"]] == [GOOD]


@pytest.mark.parametrize("mode", MODES)
def test_stored_response_annotations_have_their_shapes(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], mode: Mode
) -> None:
    """GET /v1/responses/{id} (also `?stream=true`): a stored answer's file_path id is
    shape-checked like a created one's."""
    _, up = upstream
    key = f"stored-annotation-{mode}"
    ann = copy.deepcopy(PLANTED["file_path-file_id-sentence"])
    b = _body(GOOD, [ann])
    b["instructions"] = RESPONSES.request("q", False)["instructions"]
    up.on(key, _behaviour(b, mode))
    headers = [(SCENARIO_HEADER, key)]
    if mode == "progressive":
        headers.append(("x-attack-mode", "progressive"))
    query = "" if mode == "json" else "?stream=true"
    resp = gateway.send("GET", f"/v1/responses/{ID}{query}", headers=headers)
    assert [r.path for r in up.requests if r.header(SCENARIO_HEADER) == key] == [
        f"/v1/responses/{ID}"]
    assert resp.status == 200, resp.raw[:800]
    assert_no_leak(resp)
    assert RESPONSES.answer_text(resp) == GOOD
