"""The gemini entry of the adversarial matrix (tests/attacks/protocols.py `REGISTRY`):
builders for `generateContent` / `streamGenerateContent?alt=sse` and the gemini-specific plants
(thought parts, unknown part and candidate fields, grounding titles and texts, search entry
point HTML, function-call args, grounding supports that point at the marker)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tests.attacks.harness import RawResponse
from tests.upstream_app import sse_events

if TYPE_CHECKING:
    from tests.attacks.protocols import Plant, ProtocolSpec

PATH = "/v1beta/models/fake-model:generateContent"
STREAM_PATH = "/v1beta/models/fake-model:streamGenerateContent?alt=sse"
_HEAD = {"modelVersion": "fake-model", "responseId": "resp-attack"}
_USAGE = {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15}


def _cand(parts: list[dict[str, Any]], index: int = 0, **extra: Any) -> dict[str, Any]:
    return {"content": {"role": "model", "parts": parts}, "index": index, **extra}


def body(text: str) -> dict[str, Any]:
    return {"candidates": [_cand([{"text": text}], finishReason="STOP")],
            "usageMetadata": dict(_USAGE), **_HEAD}  # a copy: plants mutate it


def chunks(text: str, piece: int) -> list[dict[str, Any]]:
    out = [{"candidates": [_cand([{"text": text[i : i + piece]}])], **_HEAD}
           for i in range(0, len(text), piece)]
    out.append({"candidates": [_cand([{"text": ""}], finishReason="STOP")],
                "usageMetadata": dict(_USAGE), **_HEAD})
    return out


def sse(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + b"\n\n"


def request(question: str, stream: bool, context: str) -> dict[str, Any]:
    return {
        "systemInstruction": {"parts": [{"text": context}]},
        "contents": [{"role": "user", "parts": [{"text": question}]}],
    }


def answer_text(resp: RawResponse) -> str:
    def texts(obj: Any) -> list[str]:
        out = []
        for cand in (obj.get("candidates") or [])[:1] if isinstance(obj, dict) else []:
            for part in ((cand.get("content") or {}).get("parts") or []):
                if isinstance(part.get("text"), str) and not part.get("thought"):
                    out.append(part["text"])
        return out

    if "event-stream" in (resp.header("content-type") or ""):
        out: list[str] = []
        for _, data in sse_events(resp.body):
            try:
                out.extend(texts(json.loads(data)))
            except ValueError:
                continue
        return "".join(out)
    try:
        return "".join(texts(resp.json()))
    except ValueError:
        return ""


def error_envelope(message: str) -> dict[str, Any]:
    return {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}


def plants(
    plant: type[Plant], good: str, bad: str, piece: int,
    sse_line_plants: Callable[..., dict[str, Plant]],
) -> dict[str, Plant]:
    def mut(fn: Callable[[dict[str, Any]], None], text: str = good) -> Callable[[], object]:
        def build() -> object:
            b = copy.deepcopy(body(text))
            fn(b)
            return b
        return build

    def smut(fn: Callable[[list[dict[str, Any]]], None], text: str = good) -> Callable[[], bytes]:
        def build() -> bytes:
            cs = chunks(text, piece)
            fn(cs)
            return b"".join(sse(c) for c in cs)
        return build

    def both(fn: Callable[[dict[str, Any]], None]) -> Plant:
        """`fn` applied to the JSON body and to the last stream chunk."""
        return plant(json=mut(fn), stream=smut(lambda cs: fn(cs[-1])))

    def cand(b: dict[str, Any]) -> dict[str, Any]:
        return b["candidates"][0]  # type: ignore[no-any-return]

    def add_part(part: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
        return lambda b: cand(b)["content"]["parts"].append(part)

    def grounding(chunk: dict[str, Any], text: str = good) -> Callable[[dict[str, Any]], None]:
        raw = text.encode()

        def fn(b: dict[str, Any]) -> None:
            cand(b)["groundingMetadata"] = {
                "groundingChunks": [chunk],
                "groundingSupports": [{"segment": {"startIndex": 0, "endIndex": len(raw),
                                                   "text": text},
                                       "groundingChunkIndices": [0]}],
                "webSearchQueries": [bad],
                "searchEntryPoint": {"renderedContent": f"<div>{bad}</div>"},
            }
        return fn

    frames = lambda: [sse(c) for c in chunks(good, piece)]  # noqa: E731
    data_frame = lambda: sse({"candidates": [_cand([{"text": ""}])], **_HEAD})  # noqa: E731
    out: dict[str, Plant] = {
        "top-level-unknown-key": both(lambda b: b.__setitem__("x_trace", bad)),
        "model-version-not-token": both(lambda b: b.__setitem__("modelVersion", bad)),
        "response-id-not-token": both(lambda b: b.__setitem__("responseId", bad)),
        "usage-unknown-text": both(lambda b: b["usageMetadata"].__setitem__("x_note", bad)),
        "candidate-unknown-key": both(lambda b: cand(b).__setitem__("x_meta", {"note": bad})),
        "finish-reason-not-token": both(lambda b: cand(b).__setitem__("finishReason", bad)),
        "finish-message": both(lambda b: cand(b).__setitem__("finishMessage", bad)),
        "citation-metadata": both(lambda b: cand(b).__setitem__(
            "citationMetadata", {"citations": [{"title": bad, "uri": "https://x.example/"}]})),
        "safety-rating-prose": both(lambda b: cand(b).__setitem__(
            "safetyRatings", [{"category": "HARM_CATEGORY_X", "probability": bad}])),
        "prompt-feedback-message": both(lambda b: b.__setitem__(
            "promptFeedback", {"blockReasonMessage": bad})),
        "thought-part": both(add_part({"text": bad, "thought": True})),
        "thought-part-first": plant(
            json=mut(lambda b: cand(b)["content"]["parts"].insert(
                0, {"text": bad, "thought": True})),
            stream=smut(lambda cs: cs.insert(0, {"candidates": [_cand([
                {"text": bad, "thought": True}])], **_HEAD})),
        ),
        "part-unknown-key": both(add_part({"executableCode": {"code": f"print('{bad}')"}})),
        "part-extra-key-on-text": plant(
            json=mut(lambda b: cand(b)["content"]["parts"][0].__setitem__("x_note", bad)),
            stream=smut(lambda cs: cs[0]["candidates"][0]["content"]["parts"][0].__setitem__(
                "x_note", bad)),
        ),
        "role-not-model": both(lambda b: cand(b)["content"].__setitem__("role", bad)),
        "function-call-args": both(add_part(
            {"functionCall": {"name": "lookup", "args": {"summary": bad}}})),
        "function-call-name": both(add_part({"functionCall": {"name": bad, "args": {}}})),
        "function-call-id": both(add_part(
            {"functionCall": {"id": bad, "name": "lookup", "args": {}}})),
        "second-candidate": plant(
            json=mut(lambda b: b["candidates"].append(_cand([{"text": bad}], 1,
                                                             finishReason="STOP"))),
            stream=smut(lambda cs: cs.insert(0, {"candidates": [_cand(
                [{"text": bad}], 1, finishReason="STOP")], **_HEAD})),
        ),
        "content-hallucinated": plant(
            json=lambda: body(f"{good} {bad}"),
            stream=lambda: b"".join(sse(c) for c in chunks(f"{good} {bad}", piece)),
        ),
        "grounding-retrieved-title-and-text": both(grounding(
            {"retrievedContext": {"uri": "gs://kb/x.pdf", "title": bad, "text": bad}})),
        "grounding-web-title": both(grounding(
            {"web": {"uri": "https://x.example/", "title": bad, "domain": "x.example"}})),
        "grounding-uri-prose": both(grounding({"web": {"uri": bad}})),
        "grounding-supports-the-marker": plant(
            json=mut(grounding({"retrievedContext": {"uri": "gs://kb/y", "text": bad}}, bad),
                     bad),
            stream=smut(lambda cs: grounding(
                {"retrievedContext": {"uri": "gs://kb/y", "text": bad}}, bad)(cs[-1]), bad),
        ),
        "grounding-segment-out-of-range": plant(
            json=mut(lambda b: cand(b).__setitem__("groundingMetadata", {
                "groundingChunks": [{"web": {"uri": "https://x.example/"}}],
                "groundingSupports": [{"segment": {"startIndex": 0, "endIndex": 9999},
                                       "groundingChunkIndices": [0]}]}), f"{good} {bad}"),
            fail_closed=True,
        ),
        "error-chunk-mid-stream": plant(
            stream=smut(lambda cs: cs.insert(1, {"error": {"code": 500, "message": bad,
                                                           "status": "INTERNAL"}})),
            fail_closed=True,
        ),
        "truncated-stream": plant(
            stream=smut(lambda cs: cs.__setitem__(slice(len(cs) - 1, None), []),
                        f"{good} {bad}"),
            fail_closed=True,
        ),
    }
    out.update(sse_line_plants(frames, data_frame))
    return out


def planted_requests(question: str, stream: bool, context: str, planted: str,
                     where: str) -> dict[str, Any]:
    req = request(question, stream, context)
    if where == "user-text":
        req["contents"][0]["parts"][0]["text"] = f"{planted} {question}"
    elif where == "user-second-part":
        req["contents"][0]["parts"].append({"text": planted})
    elif where == "model-turn":
        req["contents"][:0] = [
            {"role": "user", "parts": [{"text": "Hello."}]},
            {"role": "model", "parts": [{"text": planted}]},
        ]
    elif where == "thought-in-user-turn":
        req["contents"][0]["parts"].append({"text": planted, "thought": True})
    return req


def trusted_request(question: str, stream: bool, context: str, where: str) -> dict[str, Any]:
    req = request(question, stream, context)
    if where == "function-response":
        req.pop("systemInstruction")
        req["contents"] += [
            {"role": "model", "parts": [{"functionCall": {"name": "kb", "args": {}}}]},
            {"role": "user", "parts": [{"functionResponse": {
                "name": "kb", "response": {"result": context}}}]},
        ]
    return req


def spec(
    spec_type: type[ProtocolSpec], plant: type[Plant], *, context: str, planted: str,
    good: str, bad: str, piece: int, sse_line_plants: Callable[..., dict[str, Plant]],
) -> ProtocolSpec:
    return spec_type(
        name="gemini",
        path=PATH,
        stream_path=STREAM_PATH,
        streams=True,
        text_key="text",
        request=lambda q, s: request(q, s, context),
        body=body,
        frames=lambda text: [sse(c) for c in chunks(text, piece)],
        answer_text=answer_text,
        error_envelope=error_envelope,
        plants=plants(plant, good, bad, piece, sse_line_plants),
        planted_requests={
            where: (lambda q, s, w=where: planted_requests(q, s, context, planted, w))
            for where in ("user-text", "user-second-part", "model-turn", "thought-in-user-turn")
        },
        trusted_requests={
            where: (lambda q, s, w=where: trusted_request(q, s, context, w))
            for where in ("system-instruction", "function-response")
        },
        error_protocol="gemini",
    )
