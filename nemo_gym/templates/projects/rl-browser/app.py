"""A browser agent on a local web shop: the tools drive a real Chromium through Playwright, and the reward reads
which form the shop received, with which values.

At start-up the server serves the pages of `site/` on a loopback port of its own (a second small web app in
this process, apart from the server's API) and launches the system Chromium (`chromium_path`; Playwright's
browser download is never used). Each rollout gets its own browser context (page, cookies), opened at its
first tool call and closed by `verify`; every request of that context carries the rollout's key in a header,
so the shop records which rollout submitted what. Requests to any other address are blocked.
"""

from __future__ import annotations

import asyncio
import re
import socket
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urljoin

import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse
from playwright.async_api import Browser, BrowserContext, Page, Playwright, Route, async_playwright
from playwright.async_api import Error as PlaywrightError
from pydantic import Field

from nemo_gym.env.resources_server import ResourcesServer, VerifyRequest, VerifyResult
from nemo_gym.env.tools import tool
from nemo_gym.serving.server import ServerConfig, Session

SITE = Path(__file__).resolve().parent / "site"
PAGES = {"/": "index.html", "/newsletter": "newsletter.html", "/contact": "contact.html", "/order": "order.html"}
FORMS = ("newsletter", "contact", "order")
ROLLOUT_HEADER = "x-rollout-key"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
MAX_ROLLOUTS_REMEMBERED = 10_000  # rollouts whose submissions are kept for verify (the oldest are dropped first)
MAX_ERROR_CHARS = 300
BROWSER_GONE = re.compile(
    r"crashed|has been closed|target closed|disconnected", re.IGNORECASE
)  # Playwright's words for a dead page or browser
TOOL_ORDER = ["navigate", "read_page", "type_text", "click"]
ELEMENTS_JS = """elements => elements.map(e => ({
  selector: e.id ? '#' + e.id : e.tagName.toLowerCase(),
  kind: e.tagName.toLowerCase(),
  label: ((e.labels && e.labels.length ? e.labels[0].innerText : e.innerText) || '').trim(),
  value: e.tagName === 'INPUT' ? e.value : undefined,
}))"""


class BrowserConfig(ServerConfig):
    chromium_path: str = Field(
        "/usr/bin/chromium",
        description="the system Chromium (apt-get install chromium); never a browser Playwright downloads",
    )
    action_timeout_s: float = Field(3.0, gt=0, description="longest a click or typing may take, seconds")
    navigation_timeout_s: float = Field(
        20.0,
        gt=0,
        description="longest a page load (navigate) may take, seconds: a rollout's first page opens in a new browser"
        " context, which took more than 3 s on a busy 2-core machine",
    )
    max_text_chars: int = Field(3000, ge=100, description="read_page cuts the page text to this many characters")
    max_open_rollouts: int = Field(
        32, ge=1, description="browser contexts open at once; beyond, the least recently used one is closed"
    )


class BrowserTask(VerifyRequest):
    """A dataset row as /verify receives it: the prompt, the model's `response`, and the form the task asks for."""

    expected_form: str = Field(description="newsletter, contact or order")
    expected_fields: dict[str, str] = Field(description="every field of that form with its expected value")


def shop_app(record: Any) -> FastAPI:
    """The local shop: the pages of `site/`; a POST of a form calls `record(rollout key, form, fields)`."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/{path:path}")
    async def page(path: str) -> HTMLResponse:
        name = PAGES.get("/" + path.strip("/"))
        if name is None:
            return HTMLResponse("<h1>Not found</h1><p><a href='/'>Back to the shop</a></p>", status_code=404)
        return HTMLResponse((SITE / name).read_text())

    @app.post("/{form}")
    async def submit(form: str, request: Request) -> HTMLResponse:
        if form not in FORMS:
            return HTMLResponse("<h1>Not found</h1>", status_code=404)
        fields = dict(parse_qsl((await request.body()).decode(errors="replace"), keep_blank_values=True))
        record(request.headers.get(ROLLOUT_HEADER, ""), form, fields)
        listed = "".join(f"<li>{k}: {v}</li>" for k, v in fields.items()).replace("<script", "&lt;script")
        return HTMLResponse(
            f"<h1>Thank you</h1><p>We received your {form} form:</p><ul>{listed}</ul><p><a href='/'>Back to the"
            " shop</a></p>"
        )

    return app


def _short(exc: Exception) -> str:
    return str(exc).splitlines()[0][:MAX_ERROR_CHARS] if str(exc) else type(exc).__name__


def _normalized(fields: dict[str, str], keys: Any) -> dict[str, str]:
    return {key: " ".join(str(fields.get(key, "")).split()).casefold() for key in keys}


class BrowserServer(ResourcesServer):
    """Fill in and submit forms of a local web shop in Chromium. Reward range: [0.0, 1.0], binary."""

    Config = BrowserConfig
    config: BrowserConfig
    verify_request_type = BrowserTask

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.submissions: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()  # rollout key → forms received
        self.submissions_lock = threading.Lock()  # the shop records from its own thread
        self.contexts: OrderedDict[str, tuple[BrowserContext, Page]] = OrderedDict()
        self.site_url = ""

    # -- the shop and the browser ----------------------------------------------------------------------------
    def record(self, key: str, form: str, fields: dict[str, str]) -> None:
        with self.submissions_lock:
            self.submissions.setdefault(key, []).append({"form": form, "fields": fields})
            self.submissions.move_to_end(key)
            while len(self.submissions) > MAX_ROLLOUTS_REMEMBERED:
                self.submissions.popitem(last=False)

    async def startup(self) -> None:
        chromium = Path(self.config.chromium_path)
        if not chromium.is_file():
            raise RuntimeError(
                f"Chromium not found at {chromium} (chromium_path): install it with `apt-get install chromium`"
            )
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        self.site_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.site = uvicorn.Server(uvicorn.Config(shop_app(self.record), log_level="warning", access_log=False))
        self.site_thread = threading.Thread(target=self.site.run, kwargs={"sockets": [sock]}, name="shop", daemon=True)
        self.site_thread.start()  # its own thread and event loop: uvicorn leaves signals alone outside the main thread
        self.playwright: Playwright = await async_playwright().start()
        self.browser: Browser = await self.playwright.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)

    async def shutdown(self) -> None:
        for key in list(self.contexts):
            await self.close_page(key)
        await self.browser.close()
        await self.playwright.stop()
        self.site.should_exit = True
        await asyncio.to_thread(self.site_thread.join, 10)

    async def _only_the_shop(self, route: Route) -> None:
        if route.request.url == self.site_url or route.request.url.startswith(self.site_url + "/"):
            await route.continue_()
        else:
            await route.abort("blockedbyclient")

    async def page_for(self, session: Session) -> Page:
        """The rollout's page, opened (in a new browser context) on first use."""
        key = session.session_id
        if key in self.contexts:
            self.contexts.move_to_end(key)
            return self.contexts[key][1]
        while len(self.contexts) >= self.config.max_open_rollouts:
            await self.close_page(next(iter(self.contexts)))
        try:
            context = await self.browser.new_context(extra_http_headers={ROLLOUT_HEADER: key})
            context.set_default_timeout(self.config.action_timeout_s * 1000)
            context.set_default_navigation_timeout(self.config.navigation_timeout_s * 1000)
            await context.route("**/*", self._only_the_shop)
            page = await context.new_page()
        except PlaywrightError as exc:
            raise HTTPException(503, f"cannot open a browser page: {_short(exc)}") from exc
        self.contexts[key] = (context, page)
        return page

    async def close_page(self, key: str) -> None:
        context, _ = self.contexts.pop(key, (None, None))
        if context is not None:
            try:
                await context.close()
            except PlaywrightError:
                pass

    def failed(self, exc: PlaywrightError) -> dict[str, Any]:
        """A failed action, for the model to read; a browser that died is an infrastructure failure instead (503:
        the rollout goes to the collector's failures file), never a score."""
        if not self.browser.is_connected() or BROWSER_GONE.search(str(exc)):
            raise HTTPException(503, f"the browser is gone: {_short(exc)}") from exc
        return {"error": _short(exc)}

    async def where(self, page: Page) -> dict[str, Any]:
        return {"url": page.url.removeprefix(self.site_url) or "/", "title": await page.title()}

    # -- the environment -------------------------------------------------------------------------------------
    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools in the order of use (navigate, read_page, type_text, click), not alphabetical: small models follow the order they are listed in."""  # noqa: E501
        return sorted(super().tool_schemas(), key=lambda schema: TOOL_ORDER.index(schema["name"]))

    async def seed_session(self, row: dict[str, Any], session: Session) -> dict[str, Any]:
        await self.close_page(session.session_id)  # a fresh browser and no submissions for this rollout
        with self.submissions_lock:
            self.submissions.pop(session.session_id, None)
        return {}

    @tool
    async def navigate(self, url: str, session: Session) -> dict[str, Any]:
        """Open a page of the shop by its path, e.g. "/" (the home page with links), "/newsletter", "/contact" or "/order"."""  # noqa: E501
        target = urljoin(self.site_url + "/", url.strip())
        if not (target == self.site_url or target.startswith(self.site_url + "/")):
            return {"error": f"only the shop's pages can be opened: a path such as / or /order, not {url[:100]!r}"}
        page = await self.page_for(session)
        try:
            await page.goto(target)
        except PlaywrightError as exc:
            return self.failed(exc)
        return await self.where(page)

    @tool
    async def read_page(self, session: Session) -> dict[str, Any]:
        """Read the open page: its address, title, visible text, and its links, fields and buttons with the selectors to use with type_text and click."""  # noqa: E501
        page = await self.page_for(session)
        if page.url == "about:blank":
            return {"error": 'no page is open yet: call navigate first, e.g. with url "/"'}
        try:
            text = await page.inner_text("body")
            elements = await page.eval_on_selector_all("a, input, textarea, select, button", ELEMENTS_JS)
        except PlaywrightError as exc:
            return self.failed(exc)
        return {**await self.where(page), "text": text[: self.config.max_text_chars], "elements": elements}

    @tool
    async def type_text(self, selector: str, text: str, session: Session) -> dict[str, Any]:
        """Replace the content of a text field with `text`; `selector` as read_page lists it, e.g. "#email"."""
        page = await self.page_for(session)
        try:
            await page.fill(selector, text)
        except PlaywrightError as exc:
            return self.failed(exc)
        return {"typed": text, "into": selector}

    @tool
    async def click(self, selector: str, session: Session) -> dict[str, Any]:
        """Click a link or button; `selector` as read_page lists it, e.g. "#subscribe". Returns the page you are on after the click."""  # noqa: E501
        page = await self.page_for(session)
        try:
            await page.click(selector)
            await page.wait_for_load_state()
        except PlaywrightError as exc:
            return self.failed(exc)
        return await self.where(page)

    async def verify(self, request: BrowserTask, session: Session) -> VerifyResult:
        """1.0 when the last submission of `expected_form` in this rollout has the `expected_fields` values (case and
        surrounding spaces ignored), else 0.0 (`failure_reason`: not_submitted or wrong_values)."""
        await self.close_page(session.session_id)  # the episode is over
        with self.submissions_lock:
            forms = [
                s["fields"] for s in self.submissions.get(session.session_id, []) if s["form"] == request.expected_form
            ]
        if not forms:
            return VerifyResult(reward=0.0, submitted_fields=None, failure_reason="not_submitted")
        correct = _normalized(forms[-1], request.expected_fields) == _normalized(
            request.expected_fields, request.expected_fields
        )
        return VerifyResult(
            reward=float(correct), submitted_fields=forms[-1], failure_reason=None if correct else "wrong_values"
        )
