"""The API's view of a gateway step (docs/gateway.md): a request an agent sent through the
gateway with only its base URL changed, then read back through the client."""

from __future__ import annotations

import json

import httpx
import pytest

from promptd_client import NotFound

from conftest import env


def test_a_gateway_steps_upstream_bytes_are_what_the_provider_got(make_client):
    gateway = env("PROMPTD_GATEWAY_URL")
    body = {"model": "claude-sonnet-4-5", "max_tokens": 10,
            "messages": [{"role": "user", "content": "Through the gateway."}]}
    sent = httpx.post(f"{gateway}/gateway/gw/v1/messages", json=body,
                      headers={"x-api-key": "sk-ant-client"}, timeout=30)
    assert sent.status_code == 200, sent.text
    session_id = sent.headers["x-promptd-session"]
    client = make_client(url=gateway, token="")
    session = client.reopen(session_id)
    upstream = session.upstream(1)
    spliced = json.loads(upstream)
    assert spliced["messages"] == body["messages"]
    assert spliced["system"][0]["type"] == "text"  # the sections promptd added
    assert any(e.kind == "gateway/request" for e in session.events())
    # The body API's own steps did not come through the gateway.
    plain = client.session("coder")
    plain.step(user="Not through the gateway.")
    with pytest.raises(NotFound) as e:
        plain.upstream(1)
    assert e.value.code == "not_a_gateway_step", e.value
