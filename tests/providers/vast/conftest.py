"""The Vast.ai fake over HTTPS, and the environment a user sets for it (the key, and the endpoint the
tests point it at; the fake's certificate trusted as the real API's is)."""

from __future__ import annotations

import pytest

from tests.support.clouds.fake_vast import KEY, FakeVastServer


@pytest.fixture
def vast_server(tmp_path, monkeypatch):
    server = FakeVastServer(tmp_path / "vast-tls")
    server.start()
    monkeypatch.setenv("SDCLOUD_VAST_ENDPOINT", server.url)
    monkeypatch.setenv("VAST_API_KEY", KEY)
    monkeypatch.setenv("SSL_CERT_FILE", str(server.ca_file))
    yield server
    server.stop()


@pytest.fixture
def fake(vast_server):
    return vast_server.fake


@pytest.fixture
def provider(vast_server):
    from sdcloud.providers import get_provider

    return get_provider("vast", poll_interval=0.01, backoff=0.0)
