"""Run first, on its own (`pytest tests/loading_check.py`, before the rest: its name is not a
test_*.py one, so `pytest tests` leaves it out): the main daemon was started unready, with a
plugin whose declare loops until its deadline, so it is still loading here. Kept apart so the
heavier imports of the other files (openai, anthropic) cannot outlast the deadline."""

from pathlib import Path

import promptd_client


def test_the_client_under_test_is_the_installed_wheel():
    where = Path(promptd_client.__file__).resolve()
    assert "site-packages" in where.parts, f"promptd_client imported from {where}"
    assert where.parent.joinpath("py.typed").is_file(), "the wheel ships py.typed"


def test_health_while_loading_says_how_far_it_got(make_client):
    # /v1/health needs no token, even on a daemon that has one.
    health = make_client(token="").health()
    assert health.status == "loading", health.raw
    assert isinstance(health.total, int) and isinstance(health.loaded, int), health.raw
    # The slow plugin is one of the files, and it is not done while loading lasts.
    assert 0 <= health.loaded < health.total, health.raw
    assert health.version, health.raw
