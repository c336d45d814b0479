from pathlib import Path

import httpx

from tests.gateway_harness import run_gateway, write_policy
from tests.upstream_app import Json, create_upstream, openai_body, serve

SYSTEM = '<chunk id="doc:1" version="2">The battery holds 62.5 kWh.</chunk>'


def _req(text: str) -> dict[str, object]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
    return {"model": "m", "messages": messages}


def test_released_and_blocked(tmp_path: Path) -> None:
    upstream = create_upstream(
        {
            "good": Json(openai_body("The battery holds 62.5 kWh [doc:1].")),
            "bad": Json(openai_body("The battery holds 70 kWh [doc:9].")),
        }
    )
    with serve(upstream) as up, run_gateway(up, [write_policy(tmp_path)]) as gw:
        r = httpx.post(gw.url + "/v1/chat/completions", json=_req("good"))
        assert r.status_code == 200, r.text
        assert r.headers["x-citewarden-decision"] == "released"
        r = httpx.post(gw.url + "/v1/chat/completions", json=_req("bad"))
        assert r.status_code == 422, r.text
        assert r.json()["citewarden"]["reason"] == "hallucinated_citation"


def test_whole_bodies_are_framed_by_length(tmp_path: Path) -> None:
    """A body the gateway holds whole (released, rewritten, blocked, an error) is sent with its
    content-length, never chunked: clients and intermediaries see where it ends up front."""
    upstream = create_upstream(
        {
            "good": Json(openai_body("The battery holds 62.5 kWh [doc:1].")),
            "partial": Json(
                openai_body("The battery holds 62.5 kWh [doc:1]. It weighs 9 kg [doc:9].")
            ),
            "bad": Json(openai_body("The battery holds 70 kWh [doc:9].")),
        }
    )
    policy = write_policy(tmp_path, on_unverified="strip")
    with serve(upstream) as up, run_gateway(up, [policy]) as gw:
        seen = set()
        for prompt in ("good", "partial", "bad"):
            r = httpx.post(gw.url + "/v1/chat/completions", json=_req(prompt))
            seen.add(r.headers["x-citewarden-decision"])
            assert "transfer-encoding" not in r.headers
            assert int(r.headers["content-length"]) == len(r.content)
        r = httpx.post(gw.url + "/v1/chat/completions", content=b"{not json")
        assert r.status_code == 400
        assert int(r.headers["content-length"]) == len(r.content)
    assert len(seen) == 3, seen
