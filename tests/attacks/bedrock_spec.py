"""The bedrock-converse entry of the adversarial matrix: Converse requests and bodies,
ConverseStream as the AWS binary event-stream (padded as the service pads it), and the plants
only this protocol has (content block members, reasoningContent, toolUse input, metadata and
trace, citationsContent with bad cited spans, event-stream frames with unknown event types,
headers and message types, exceptions and broken frames)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from gateway.demo import wire
from tests import bedrock_wire as w
from tests.attacks.harness import EVENTSTREAM, MARKER, RawResponse, eventstream_messages
from tests.attacks.protocols import (
    BAD,
    BIG_INT,
    CHUNK_TEXT,
    CONTEXT_TAG,
    GOOD,
    PIECE,
    PLANTED_TAG,
    QUESTION,
    Plant,
    ProtocolSpec,
)

Json = dict[str, Any]
Event = tuple[str, Json]
PATH = "/model/fake-model/converse"
STREAM_PATH = "/model/fake-model/converse-stream"
CLAIM = "The Orbit pump moves 40 litres per minute."  # what the document block says


def request(question: str, stream: bool, messages: list[Json] | None = None,
            system: str | None = CONTEXT_TAG) -> Json:
    req: Json = {"messages": messages if messages is not None else [
        {"role": "user", "content": [{"text": question}]}]}
    if system is not None:
        req["system"] = [{"text": system}]
    return req  # the path, not the body, asks for a stream


def with_document(req: Json) -> Json:
    req = copy.deepcopy(req)
    req["messages"][-1]["content"] = [w.document(CHUNK_TEXT, name="pump-manual"),
                                      {"text": QUESTION}]
    return req


def body(text: str) -> Json:
    return w.body({"text": text})


def events(content: list[Json], stop: str = "end_turn") -> list[Event]:
    """The ConverseStream events of a message with these blocks: text in PIECE-character
    deltas after the block's citations; a block of no known member as one delta."""
    out: list[Event] = [("messageStart", {"role": "assistant"})]
    for i, block in enumerate(content):
        def delta(d: Json, i: int = i) -> None:
            out.append(("contentBlockDelta", {"contentBlockIndex": i, "delta": d}))

        if "text" in block or "citationsContent" in block:
            text = block.get("text")
            if "citationsContent" in block:
                cc = block["citationsContent"]
                for c in cc["citations"]:
                    delta({"citation": c})
                text = "".join(p["text"] for p in cc.get("content", []))
            for piece in wire.split_fixed(str(text), PIECE):
                delta({"text": piece})
        elif "toolUse" in block:
            tu = block["toolUse"]
            start = {k: v for k, v in tu.items() if k != "input"}
            out.append(("contentBlockStart", {"contentBlockIndex": i,
                                              "start": {"toolUse": start}}))
            delta({"toolUse": {"input": json.dumps(tu["input"])}})
        elif "reasoningContent" in block:
            rc = block["reasoningContent"]
            if "redactedContent" in rc:
                delta({"reasoningContent": {"redactedContent": rc["redactedContent"]}})
            else:
                delta({"reasoningContent": {"text": rc["reasoningText"]["text"]}})
                if rc["reasoningText"].get("signature"):
                    delta({"reasoningContent": {"signature": rc["reasoningText"]["signature"]}})
        else:
            delta(block)
        out.append(("contentBlockStop", {"contentBlockIndex": i}))
    out.append(("messageStop", {"stopReason": stop}))
    out.append(("metadata", {"usage": {"inputTokens": 30, "outputTokens": 12,
                                       "totalTokens": 42}, "metrics": {"latencyMs": 321}}))
    return out


def framed(evs: list[Event]) -> list[bytes]:
    return [w.event(name, data) for name, data in evs]


def frames(text: str) -> list[bytes]:
    return framed(events([{"text": text}]))


def answer_text(resp: RawResponse) -> str:
    if EVENTSTREAM in (resp.header("content-type") or ""):
        out = []
        for headers, payload in eventstream_messages(resp.body):
            if headers.get(":event-type") != "contentBlockDelta":
                continue
            try:
                piece = json.loads(payload)["delta"].get("text")
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
            if isinstance(piece, str):
                out.append(piece)
        return "".join(out)
    try:
        content = resp.json()["output"]["message"]["content"]
    except (ValueError, KeyError, TypeError):
        return ""
    out = []
    for block in content:
        if isinstance(block.get("text"), str):
            out.append(block["text"])
        elif "citationsContent" in block:
            out.extend(p.get("text", "") for p in block["citationsContent"]["content"])
    return "".join(out)


# -- plants ----------------------------------------------------------------------------------


def _blocks(*content: Json, request: Callable[[Json], Json] | None = None,
            fail_closed: bool = False, **top: Any) -> Plant:
    """A message with these content blocks (and top-level fields, which a stream carries in
    its metadata event), as a body and as a stream."""
    def json_fn() -> Json:
        b = w.body(*copy.deepcopy(content))
        b.update(copy.deepcopy(top))
        return b

    def stream_fn() -> list[bytes]:
        evs = events(copy.deepcopy(list(content)))
        evs[-1][1].update(copy.deepcopy(top))
        return framed(evs)

    return Plant(json=json_fn, stream=stream_fn, request=request, fail_closed=fail_closed)


def _mut(fn: Callable[[Json], None]) -> Callable[[], Json]:
    def build() -> Json:
        b = body(GOOD)
        fn(b)
        return b

    return build


def _smut(fn: Callable[[list[Event]], None], text: str = GOOD) -> Callable[[], list[bytes]]:
    def build() -> list[bytes]:
        evs = events([{"text": text}])
        fn(evs)
        return framed(evs)

    return build


def _both(json_fn: Callable[[Json], None], stream_fn: Callable[[list[Event]], None]) -> Plant:
    return Plant(json=_mut(json_fn), stream=_smut(stream_fn))


def _named(name: str) -> Callable[[list[Event]], Json]:
    return lambda evs: next(d for n, d in evs if n == name)


_start, _stop, _meta = _named("messageStart"), _named("messageStop"), _named("metadata")


def _citation(cited: str = CHUNK_TEXT, start: int = 0, end: int = len(CHUNK_TEXT),
              index: int = 0, **over: Any) -> Json:
    return {"title": "pump-manual", "sourceContent": [{"text": cited}],
            "location": {"documentChar": {"documentIndex": index, "start": start, "end": end}},
            **over}


def _cited(text: str, *citations: Json) -> Plant:
    return _blocks(w.cited(text, *citations), request=with_document)


def _insert(at: int, *raw: bytes, text: str = GOOD) -> Callable[[], list[bytes]]:
    """Raw frames inserted among the frames of `text` (negative: from the end)."""
    def build() -> list[bytes]:
        fs = frames(text)
        return [*fs[:at], *raw, *fs[at:]]

    return build


def _exception(kind: str = "modelStreamErrorException") -> bytes:
    return w.exception(kind, BAD)


def _bad_crc() -> bytes:
    frame = bytearray(w.event("contentBlockDelta", {"contentBlockIndex": 0,
                                                    "delta": {"text": f" {BAD}"}}))
    frame[-1] ^= 0xFF
    return bytes(frame)


def plants() -> dict[str, Plant]:
    bad_text = f"{GOOD} {BAD}"
    claim_bad = f"The Orbit pump was designed by {BAD.split(' by ')[1].split(' [')[0]}."
    reasoning = {"reasoningContent": {"reasoningText": {"text": BAD, "signature": "c2lnbmF0dXJl"}}}
    tool = {"toolUse": {"toolUseId": "tooluse_1", "name": "lookup", "input": {}}}
    out: dict[str, Plant] = {
        "content-hallucinated": _blocks({"text": bad_text}),
        "second-text-block": _blocks({"text": GOOD}, {"text": f" {BAD}"}),
        "top-level-unknown-key": _blocks({"text": GOOD}, x_trace=BAD),
        "additional-model-response-fields": _both(
            lambda b: b.__setitem__("additionalModelResponseFields", {"note": BAD}),
            lambda evs: _stop(evs).__setitem__("additionalModelResponseFields", {"note": BAD})),
        "trace": _blocks({"text": GOOD}, trace={"guardrail": {"modelOutput": [BAD]}}),
        "usage-unknown-key": _both(lambda b: b["usage"].__setitem__("x_note", BAD),
                                   lambda evs: _meta(evs)["usage"].__setitem__("x_note", BAD)),
        "metrics-unknown-key": _both(lambda b: b["metrics"].__setitem__("x_note", BAD),
                                     lambda evs: _meta(evs)["metrics"].__setitem__("x", BAD)),
        "performance-config-prose": _blocks({"text": GOOD}, performanceConfig={"latency": BAD}),
        "service-tier-prose": _blocks({"text": GOOD}, serviceTier={"type": BAD}),
        "stop-reason-prose": _both(lambda b: b.__setitem__("stopReason", BAD),
                                   lambda evs: _stop(evs).__setitem__("stopReason", BAD)),
        "output-unknown-key": Plant(json=_mut(lambda b: b["output"].__setitem__("x_note", BAD))),
        "message-unknown-key": _both(
            lambda b: b["output"]["message"].__setitem__("x_note", BAD),
            lambda evs: _start(evs).__setitem__("x_note", BAD)),
        "role-not-assistant": _both(
            lambda b: b["output"]["message"].__setitem__("role", BAD),
            lambda evs: _start(evs).__setitem__("role", BAD)),
        "block-unknown-member": _blocks({"text": GOOD}, {"x_debug": {"text": BAD}}),
        "block-extra-key-beside-text": Plant(json=_mut(
            lambda b: b["output"]["message"]["content"][0].__setitem__("x_note", BAD))),
        "delta-extra-member": Plant(stream=_smut(
            lambda evs: evs[1][1]["delta"].__setitem__("x_note", BAD))),
        "block-start-unknown-member": Plant(stream=_smut(lambda evs: evs.insert(1, (
            "contentBlockStart", {"contentBlockIndex": 0, "start": {"x_debug": BAD}})))),
        "reasoning-text": _blocks(reasoning, {"text": GOOD}),
        "reasoning-text-after-answer": _blocks({"text": GOOD}, reasoning),
        "reasoning-redacted-prose": _blocks({"reasoningContent": {"redactedContent": BAD}},
                                            {"text": GOOD}),
        "reasoning-unknown-member": Plant(json=_mut(
            lambda b: b["output"]["message"]["content"].insert(
                0, {"reasoningContent": {"x_summary": BAD}}))),
        "tool-use-input": _blocks({"text": GOOD}, {"toolUse": {
            **tool["toolUse"], "input": {"summary": BAD}}}, stopReason="tool_use"),
        "tool-use-name": _blocks({"text": GOOD}, {"toolUse": {**tool["toolUse"], "name": BAD}}),
        "tool-use-id": _blocks({"text": GOOD}, {"toolUse": {**tool["toolUse"],
                                                            "toolUseId": BAD}}),
        "tool-use-unknown-key": _blocks({"text": GOOD}, {"toolUse": {**tool["toolUse"],
                                                                     "x_note": BAD}}),
        # citationsContent against the request's document block
        "citation-claim-not-in-document": _cited(claim_bad, _citation()),
        "citation-cited-text-not-the-span": _cited(claim_bad, _citation(cited=BAD)),
        "citation-span-out-of-range": _cited(claim_bad, _citation(end=9999)),
        "citation-document-out-of-range": _cited(claim_bad, _citation(index=7)),
        "citation-page-location": _cited(claim_bad, {
            "sourceContent": [{"text": CHUNK_TEXT}],
            "location": {"documentPage": {"documentIndex": 0, "start": 1, "end": 2}}}),
        "citation-web-location": _cited(claim_bad, {
            "title": BAD, "sourceContent": [{"text": BAD}],
            "location": {"web": {"url": "https://example.com/pump", "domain": "example.com"}}}),
        "citation-no-location": _cited(claim_bad, {"sourceContent": [{"text": BAD}]}),
        "citation-title": _cited(CLAIM, _citation(title=BAD)),
        "citation-source": _cited(CLAIM, _citation(source=BAD)),
        "citation-unknown-key": _cited(CLAIM, _citation(x_note=BAD)),
        "citation-location-unknown-key": _cited(CLAIM, {
            **_citation(), "location": {"documentChar": {
                "documentIndex": 0, "start": 0, "end": len(CHUNK_TEXT), "x_note": BAD}}}),
        "citation-on-empty-text": _blocks({"text": GOOD}, w.cited("", _citation(cited=BAD)),
                                          request=with_document),
        "citation-beside-no-content": _blocks({"text": GOOD}, {"citationsContent": {
            "citations": [_citation(cited=BAD)]}}, request=with_document),
        "error-type-header-prose": Plant(
            json=lambda: {"message": "refused"}, stream=lambda: {"message": "refused"},
            status=400, headers={"x-amzn-errortype": f"{MARKER}Exception:http://x/"}),
        "error-envelope-type-field": Plant(
            json=lambda: {"message": "refused", "__type": BAD, "Message": BAD},
            stream=lambda: {"message": "refused", "__type": BAD}, status=400),
        # -- stream only: event-stream frames ---------------------------------------------
        "unknown-event-type": Plant(stream=_insert(-2, w.event("x-debug", {"note": BAD}))),
        "unknown-event-type-text-shaped": Plant(stream=_insert(-2, w.event(
            "contentBlockDeltaV2", {"contentBlockIndex": 0, "delta": {"text": BAD}}))),
        "unknown-header": Plant(stream=_insert(2, w.raw_event(
            "contentBlockDelta", json.dumps({"contentBlockIndex": 0, "delta": {"text": ""}}),
            **{"x-note": BAD}))),
        "padding-prose": Plant(stream=_smut(
            lambda evs: [d.__setitem__("p", BAD) for _, d in evs] and None)),
        "event-after-metadata": Plant(stream=lambda: [*frames(GOOD), w.event(
            "contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": f" {BAD}"}})]),
        "exception-mid-stream": Plant(stream=_insert(-2, _exception(), text=bad_text),
                                      fail_closed=True),
        "throttling-exception-mid-stream": Plant(
            stream=_insert(-2, _exception("throttlingException"), text=bad_text),
            fail_closed=True),
        "error-message-frame": Plant(stream=_insert(-2, w.message(
            {":message-type": "error", ":error-code": "InternalFailure",
             ":error-message": BAD}), text=bad_text), fail_closed=True),
        "unknown-message-type": Plant(stream=_insert(-2, w.message(
            {":message-type": "x-debug", ":content-type": "application/json"},
            json.dumps({"note": BAD}).encode()), text=bad_text), fail_closed=True),
        "bad-crc-frame": Plant(stream=_insert(-2, _bad_crc()), fail_closed=True),
        "payload-not-utf8": Plant(stream=_insert(-2, w.raw_event(
            "contentBlockDelta", b'{"contentBlockIndex": 0, "delta": {"text": "\xff' +
            BAD.encode() + b'"}}')), fail_closed=True),
        "truncated-stream": Plant(stream=lambda: frames(bad_text)[:-2], fail_closed=True),
        "truncated-mid-frame": Plant(
            stream=lambda: b"".join(frames(bad_text))[:-40], fail_closed=True),
    }
    return out


# -- generic plants whose SSE edit does not apply to a binary stream ------------------------


def _text_frame(payload: str) -> list[bytes]:
    fs = frames(GOOD)
    return [fs[0], w.raw_event("contentBlockDelta", payload), *fs[2:]]


def _first_delta(extra: str) -> str:
    return ('{"contentBlockIndex": 0, "delta": {' + extra + "}}")


def overrides() -> dict[str, Callable[[], list[bytes] | bytes]]:
    good, bad = json.dumps(GOOD[:PIECE]), json.dumps(BAD)
    return {
        "malformed-stream-frame": lambda: _text_frame(
            '{"contentBlockIndex": 0, "delta": {"text": ' + bad),
        "duplicate-key-text": lambda: _text_frame(
            _first_delta(f'"text": {good}, "text": {bad}')),
        "duplicate-key-text-reversed": lambda: _text_frame(
            _first_delta(f'"text": {bad}, "text": {good}')),
        "duplicate-key-top-level": lambda: _text_frame(
            '{"x_dup": ' + bad + ', "x_dup": 1, "contentBlockIndex": 0, "delta": {"text": '
            + good + "}}"),
        "duplicate-key-beside-big-integer": lambda: _text_frame(
            _first_delta(f'"text": {good}, "text": {bad}{BIG_INT}')),
    }


# -- requests --------------------------------------------------------------------------------


def _user(*blocks: Json) -> Json:
    return {"role": "user", "content": list(blocks)}


def planted(where: str) -> Callable[[str, bool], Json]:
    def build(question: str, stream: bool) -> Json:
        if where == "user-text":
            msgs = [_user({"text": f"{PLANTED_TAG}\n{question}"})]
        elif where == "user-second-block":
            msgs = [_user({"text": PLANTED_TAG}, {"text": question})]
        elif where == "assistant-history":
            msgs = [_user({"text": "Tell me about the pump."}),
                    {"role": "assistant", "content": [{"text": PLANTED_TAG}]},
                    _user({"text": question})]
        else:  # a document block in an assistant turn: never context
            msgs = [_user({"text": "Tell me about the pump."}),
                    {"role": "assistant", "content": [w.document(PLANTED_TAG, name="x")]},
                    _user({"text": question})]
        return request(question, stream, msgs, system=None)

    return build


def trusted(where: str) -> Callable[[str, bool], Json]:
    def build(question: str, stream: bool) -> Json:
        if where == "system":
            return request(question, stream)
        if where == "document":
            return request(question, stream, [_user(
                w.document(CONTEXT_TAG, name="pump-manual"), {"text": question})], system=None)
        msgs = [_user({"text": question}),
                {"role": "assistant", "content": [{"toolUse": {
                    "toolUseId": "tooluse_1", "name": "kb", "input": {}}}]},
                _user({"toolResult": {"toolUseId": "tooluse_1", "content": [
                    {"text": CONTEXT_TAG}]}})]
        return request(question, stream, msgs, system=None)

    return build


BEDROCK = ProtocolSpec(
    name="bedrock-converse",
    path=PATH,
    stream_path=STREAM_PATH,
    streams=True,
    text_key="text",
    request=request,
    body=body,
    frames=frames,
    answer_text=answer_text,
    error_envelope=lambda m: {"message": m},
    plants=plants(),
    spot_modes=("json", "progressive"),
    planted_requests={w_: planted(w_) for w_ in (
        "user-text", "user-second-block", "assistant-history", "assistant-document")},
    trusted_requests={w_: trusted(w_) for w_ in ("system", "document", "tool-result")},
    stream_content_type=EVENTSTREAM,
    stream_overrides=overrides(),
)
