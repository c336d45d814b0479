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
