"""Request limits over real HTTP: body size (413 before the body is read), header size, hostile JSON (4xx).

The 1 GiB upload runs against a server in its own process, so its memory is measured alone.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from live_servers import serve

from nemo_gym.serving.entrypoint import load_server_class
from nemo_gym.serving.head import build_head_app
from nemo_gym.serving.limits import MAX_HEADER_BYTES, parse_json_body

REPO = Path(__file__).resolve().parents[1]
WEATHER = REPO / "resources_servers/example_single_tool_call/app.py"
MiB = 2**20

# Bodies every JSON route must answer with a 4xx (and the server must live on): name → (content type, body).
HOSTILE_BODIES: dict[str, tuple[str, bytes]] = {
    "malformed": ("application/json", b'{"city": "Paris"'),
    "raw NUL byte": ("application/json", b'{"city": "Par\x00is"}'),
    "not UTF-8": ("application/json", b'{"city": "\xff\xfe"}'),
    "wrong content type": ("text/plain", b'{"city": "Paris"}'),
    "form content type": ("application/x-www-form-urlencoded", b"city=Paris"),
    "nested 10,000 deep": ("application/json", b'{"city": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"),
    "objects nested 10,000 deep": ("application/json", b'{"a":' * 10_000 + b"1" + b"}" * 10_000),
    "float overflow": ("application/json", b'{"city": "Paris", "x": 1e999999}'),
    "negative float overflow": ("application/json", b'{"city": -1e400}'),
    "5,000-digit integer": ("application/json", b'{"city": ' + b"9" * 5000 + b"}"),
    "integer beyond 64 bits": ("application/json", b'{"city": 18446744073709551616}'),
    "NaN": ("application/json", b'{"city": NaN}'),
    "Infinity": ("application/json", b'{"city": Infinity}'),
    "lone surrogate": ("application/json", b'{"city": "\\ud800"}'),
    "array, not object": ("application/json", b'["Paris"]'),
    "trailing garbage": ("application/json", b'{"city": "Paris"} {}'),
}


def weather_server(**config):
    return load_server_class(WEATHER)(config, name="weather")


@pytest.fixture(scope="module")
def weather_url() -> Iterator[str]:
    with serve(weather_server(max_body_mb=1).build_app()) as url:
        yield url


@pytest.mark.long
@pytest.mark.parametrize("route", ["/get_weather", "/seed_session", "/verify", "/aggregate_metrics"])
@pytest.mark.parametrize("case", list(HOSTILE_BODIES))
def test_hostile_json_gets_4xx_on_every_route(weather_url, route, case):
    content_type, body = HOSTILE_BODIES[case]
    with httpx.Client(base_url=weather_url, timeout=10) as client:
        answer = client.post(route, content=body, headers={"content-type": content_type})
        assert 400 <= answer.status_code < 500, (case, answer.status_code, answer.text[:300])
        expected = 415 if "content type" in case else 422
        assert answer.status_code == expected
        assert client.get("/health").json()["status"] == "ok"


def test_head_server_rejects_hostile_bodies_with_4xx():
    with serve(build_head_app()) as url, httpx.Client(base_url=url, timeout=10) as client:
        for case, (content_type, body) in HOSTILE_BODIES.items():
            answer = client.post("/register", content=body, headers={"content-type": content_type})
            assert 400 <= answer.status_code < 500, (case, answer.status_code, answer.text[:300])
        assert client.post("/register", content=b"x" * (65 * MiB)).status_code == 413


@pytest.mark.parametrize("url", ["\x1bhttp://127.0.0.1:1", "127.0.0.1:8000", "file:///etc/passwd", "http://", ""])
def test_head_server_refuses_a_registration_url_it_cannot_serve_and_discovery_still_answers(url):
    """A registration whose url is not an absolute http(s) URL is a 422 naming the field; it never reaches the
    registry, where it broke NeMo Gym's discovery route (`/global_config_dict_yaml`, 500) for every caller."""
    entry = {"name": "env", "server_type": "resources_servers", "implementation": "x", "url": url, "pid": 1}
    with serve(build_head_app()) as head, httpx.Client(base_url=head, timeout=10) as client:
        answer = client.post("/register", json=entry)
        assert answer.status_code == 422, answer.text
        assert answer.json()["detail"][0]["loc"] == ["url"]
        assert client.post("/register", json={**entry, "url": "http://127.0.0.1:8000"}).status_code == 200
        assert "port: 8000" in client.get("/global_config_dict_yaml").json()


def test_declared_body_over_the_cap_is_refused_before_it_is_read(weather_url):
    with httpx.Client(base_url=weather_url, timeout=10) as client:
        answer = client.post(
            "/get_weather", content=b"{" + b" " * (2 * MiB) + b"}", headers={"content-type": "application/json"}
        )
        assert answer.status_code == 413 and "max_body_mb" in answer.json()["detail"]
        assert answer.headers["connection"] == "close"
        # Under the cap the same route works (the body size alone decides).
        assert client.post("/get_weather", json={"city": "Paris"}).status_code == 200


def test_chunked_body_over_the_cap_is_stopped_while_streaming(weather_url):
    def chunks() -> Iterator[bytes]:
        yield b'{"city": "'
        for _ in range(64):
            yield b"a" * 64 * 1024  # 4 MiB in all, no Content-Length
        yield b'"}'

    with httpx.Client(base_url=weather_url, timeout=10) as client:
        answer = client.post("/get_weather", content=chunks(), headers={"content-type": "application/json"})
        assert answer.status_code == 413
        assert client.post("/get_weather", json={"city": "Paris"}).status_code == 200


def test_oversized_headers_are_refused(weather_url):
    with httpx.Client(base_url=weather_url, timeout=10) as client:
        answer = client.post(
            "/get_weather", json={"city": "Paris"}, headers={"x-padding": "a" * (MAX_HEADER_BYTES + 1)}
        )
        assert answer.status_code == 431 and answer.headers["connection"] == "close"
        # A head longer than one socket read stays incomplete: refused (400) before it is all buffered.
        try:
            status = client.post(
                "/get_weather", json={"city": "Paris"}, headers={"x-padding": "a" * (4 * MiB)}
            ).status_code
        except httpx.TransportError:
            status = None  # the server closed before the client had sent the whole head
        assert status in (400, None)
        assert client.post("/get_weather", json={"city": "Paris"}, headers={"x-padding": "a" * 4000}).status_code == 200


def test_parse_json_body_accepts_what_json_allows():
    assert parse_json_body(b"") == {}
    assert parse_json_body(b'{"n": 18446744073709551615, "x": 1e308, "s": "a\\u0000b"}') == {
        "n": 2**64 - 1,  # integers up to 64 bits stay exact
        "x": 1e308,
        "s": "a\x00b",  # an escaped NUL is a valid character of a JSON string
    }
    assert parse_json_body(b'"1e999 in a string"') == "1e999 in a string"
    depth_100 = b"[" * 100 + b"]" * 100
    assert parse_json_body(depth_100) == eval(depth_100.decode())


# -- 1 GiB chunked upload to a server in its own process ---------------------------------------------

_SERVER = """
import socket, sys, asyncio, uvicorn
from nemo_gym.serving.entrypoint import load_server_class
from nemo_gym.serving.limits import UVICORN_LIMITS
server_class = load_server_class(__import__("pathlib").Path(sys.argv[1]))
app = server_class({"max_body_mb": float(sys.argv[2])}, name="weather").build_app()
sock = socket.socket(); sock.bind(("127.0.0.1", 0)); sock.listen(64)
print(sock.getsockname()[1], flush=True)
asyncio.run(uvicorn.Server(uvicorn.Config(app, log_level="warning", **UVICORN_LIMITS)).serve(sockets=[sock]))
"""


class PeakRss(threading.Thread):
    """Samples a process's resident memory every 5 ms; `peak` is the highest seen (bytes)."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.process = psutil.Process(pid)
        self.peak = self.process.memory_info().rss
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.005):
            self.peak = max(self.peak, self.process.memory_info().rss)


@pytest.mark.long
@pytest.mark.integration
@pytest.mark.parametrize("route", ["/get_weather", "/verify", "/health"])
def test_1_gib_chunked_upload_is_refused_without_growing_server_memory(route):
    process = subprocess.Popen([sys.executable, "-c", _SERVER, str(WEATHER), "16"], stdout=subprocess.PIPE, cwd=REPO)
    try:
        url = f"http://127.0.0.1:{process.stdout.readline().decode().strip()}"
        with httpx.Client(base_url=url, timeout=30) as client:
            assert (
                client.post("/get_weather", json={"city": "Paris"}).status_code == 200
            )  # warm: imports, first request
            sent = 0

            def one_gib() -> Iterator[bytes]:
                nonlocal sent
                chunk = b"[1," * (MiB // 3)
                while sent < 2**30:
                    sent += len(chunk)
                    yield chunk

            rss = PeakRss(process.pid)
            before = rss.peak
            rss.start()
            started = time.monotonic()
            if route == "/health":  # a GET route that never reads its body: the server discards the upload
                answer = client.request("GET", route, content=one_gib())
            else:
                answer = client.post(route, content=one_gib(), headers={"content-type": "application/json"})
            elapsed_s = time.monotonic() - started
            rss.done.set()
            rss.join()
            if route == "/health":
                assert answer.status_code == 200 and sent >= 2**30
            else:
                assert answer.status_code == 413, answer.text[:200]
                assert sent < 64 * MiB, f"the server read {sent / MiB:.0f} MiB of the upload before refusing"
                assert elapsed_s < 5
            assert rss.peak - before < 50 * MiB, f"server RSS grew {(rss.peak - before) / MiB:.0f} MiB"
            assert process.poll() is None
    finally:
        process.kill()
        process.wait(10)
