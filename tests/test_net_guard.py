"""SSRF guard (nemo_gym.serving.net_guard): loopback, link-local, private and other internal addresses are refused."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from fastapi.testclient import TestClient
from live_servers import serve

from nemo_gym.common.errors import ConfigError
from nemo_gym.serving.entrypoint import load_server_class
from nemo_gym.serving.net_guard import (
    BlockedAddressError,
    check_url,
    check_url_async,
    guard_middleware,
    guarded_async_client,
)

REPO = Path(__file__).resolve().parent.parent

INTERNAL = [
    "http://127.0.0.1:8000/v1",
    "http://127.1.2.3/",
    "http://[::1]:80/",
    "http://localhost:11000/servers",
    "http://169.254.169.254/latest/meta-data/",
    "http://[fe80::1]/",
    "http://10.1.2.3/",
    "http://172.16.0.1/",
    "http://192.168.1.1/",
    "http://100.64.0.1/",
    "http://[fd00::1]/",
    "http://0.0.0.0:11000/",
    "http://[::]/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:169.254.169.254]/",
    "http://224.0.0.1/",
    "http://240.0.0.1/",
    "http://2130706433/",  # 127.0.0.1 as one decimal number
]


@pytest.mark.parametrize("url", INTERNAL)
def test_internal_addresses_are_refused_and_named(url):
    with pytest.raises(BlockedAddressError) as caught:
        check_url(url)
    assert url in str(caught.value)
    assert isinstance(caught.value, ConfigError) and isinstance(caught.value, ValueError)


@pytest.mark.parametrize("url", ["http://8.8.8.8/v1", "https://1.1.1.1:443/x", "http://[2001:4860:4860::8888]/"])
def test_public_addresses_pass(url):
    check_url(url)


def test_allow_private_lets_loopback_and_private_through_but_never_link_local():
    for url in [
        "http://127.0.0.1:8000/v1",
        "http://localhost:1/",
        "http://10.0.0.1/",
        "http://[::1]/",
        "http://[fd00::1]/",
    ]:
        check_url(url, allow_private=True)
    for url in ["http://169.254.169.254/", "http://[fe80::1]/", "http://0.0.0.0/", "http://[::ffff:169.254.169.254]/"]:
        with pytest.raises(BlockedAddressError, match="link-local|unspecified"):
            check_url(url, allow_private=True)


def test_allow_list_of_hosts_and_networks():
    check_url("http://169.254.169.254/", allowed=["169.254.169.254/32"])
    check_url("http://10.2.3.4/", allowed=["10.0.0.0/8"])
    check_url("http://LocalHost./", allowed=["localhost"])
    with pytest.raises(BlockedAddressError):
        check_url("http://10.2.3.4/", allowed=["192.168.0.0/16", "example.com"])


@pytest.mark.parametrize(
    "url",
    ["file:///etc/passwd", "gopher://127.0.0.1:25/", "ftp://8.8.8.8/", "http:///nohost", "not a url", "//8.8.8.8/"],
)
def test_non_http_or_hostless_urls_are_refused(url):
    with pytest.raises(BlockedAddressError):
        check_url(url)


def test_async_check():
    asyncio.run(check_url_async("http://8.8.8.8/"))
    with pytest.raises(BlockedAddressError):
        asyncio.run(check_url_async("http://localhost:1/"))


def _redirecting_app() -> FastAPI:
    app = FastAPI()

    @app.get("/target")
    async def target() -> dict:
        return {"reached": True}

    @app.get("/redirect")
    async def redirect(to: str) -> RedirectResponse:
        return RedirectResponse(to)

    return app


async def _httpx_get(target: str, **guard) -> dict:
    async with guarded_async_client(follow_redirects=True, **guard) as http:
        return (await http.get(target)).json()


async def _aiohttp_get(target: str, **guard) -> dict:
    async with aiohttp.ClientSession(middlewares=[guard_middleware(**guard)]) as http, http.get(target) as answer:
        return await answer.json()


@pytest.mark.parametrize("get", [_httpx_get, _aiohttp_get], ids=["httpx_hook", "aiohttp_middleware"])
def test_guarded_client_checks_every_request_and_redirect(get):
    with serve(_redirecting_app()) as url:
        port = url.rsplit(":", 1)[1]

        with pytest.raises(BlockedAddressError):
            asyncio.run(get(f"{url}/target"))
        assert asyncio.run(get(f"{url}/target", allow_private=True)) == {"reached": True}
        # `localhost` is on the allow-list, 127.0.0.1 is not: the redirect to it is refused
        assert asyncio.run(get(f"http://localhost:{port}/target", allowed=["localhost"])) == {"reached": True}
        with pytest.raises(BlockedAddressError, match="127.0.0.1"):
            asyncio.run(
                get(f"http://localhost:{port}/redirect?to=http://127.0.0.1:{port}/target", allowed=["localhost"])
            )
        with pytest.raises(BlockedAddressError, match="169.254.169.254"):
            asyncio.run(get(f"{url}/redirect?to=http://169.254.169.254/latest/meta-data/", allow_private=True))


def test_openai_model_refuses_a_metadata_or_private_endpoint_at_start():
    model = load_server_class(REPO / "responses_api_models" / "openai_model" / "app.py")
    fields = {"openai_api_key": "sk-x", "openai_model": "m"}
    with pytest.raises(BlockedAddressError, match="169.254.169.254"):
        with TestClient(model({**fields, "openai_base_url": "http://169.254.169.254/v1"}).build_app()):
            pass
    with pytest.raises(BlockedAddressError, match="loopback"):
        with TestClient(
            model({**fields, "openai_base_url": "http://127.0.0.1:9/v1", "allow_private_addresses": False}).build_app()
        ):
            pass
    with TestClient(
        model({**fields, "openai_base_url": "http://127.0.0.1:9/v1"}).build_app()
    ) as client:  # a local vLLM: allowed by default
        assert client.get("/health").status_code == 200
