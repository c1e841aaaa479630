"""The server-sent events parser on the stream's own syntax (no daemon needed)."""

from promptd_client._core import SSEParser


def feed(text):
    parser, events = SSEParser(), []
    for line in text.split("\n"):
        event = parser.feed(line)
        if event is not None:
            events.append(event)
    return events


def test_events_comments_and_multiline_data():
    events = feed(
        ": keep-alive\n\n"
        "id: 7\nevent: load\n"
        'data: {"seq":7,"kind":"load","plugin":"tools","file":"tools.wasm",\n'
        'data: "sha256":"ab","error":null}\n\n'
        "event: lagged\ndata: {\"missed\": 3}\n\n")
    assert [(e.seq, e.kind, e.plugin, e.missed) for e in events] == [
        (7, "load", "tools", None), (None, "lagged", None, 3)]
    assert events[0].file == "tools.wasm" and events[0].error is None


def test_an_error_in_an_event():
    [event] = feed('id: 2\nevent: refused\ndata: {"seq":2,"kind":"refused","plugin":"p",'
                   '"file":"p.wasm","sha256":"cd",'
                   '"error":{"code":"wrong_world","message":"m"}}\n\n')
    assert (event.kind, event.error.code, event.error.message) == ("refused", "wrong_world", "m")
