"""The client of `ng_serve`: logging in, organizations, and the HTTP client the run commands use when they talk to a
server (those commands: `nemo_gym.team.remote_runs`).

  ng_login +server=URL [+token=...]     token from +token, $NEMO_GYM_SERVER_TOKEN or the terminal (not echoed);
                                        checked with the server (GET /v1/me), then kept in the ng_login file
                                        ($NEMO_GYM_HOME/credentials.json, mode 0600, entry "ng_serve")
  ng_logout +server=URL                 forget it
  ng_orgs / ng_orgs <ORG>               list the organizations / switch the active one

The token goes only into the `Authorization` header of requests to the server it was given for; no message prints it.
"""

from __future__ import annotations

import dataclasses
import getpass
import io
import os
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.common.errors import ConfigError, NemoGymError
from nemo_gym.datasets.common import load_login, remove_login, save_login

__all__ = [
    "LOGIN_ENTRY",
    "TOKEN_ENV",
    "ServerLogin",
    "TeamServerError",
    "TeamClient",
    "OrgsOptions",
    "current_login",
    "login_server",
    "logout_server",
    "orgs_main",
    "require_login",
]

LOGIN_ENTRY = "ng_serve"  # the entry of the ng_login file
TOKEN_ENV = "NEMO_GYM_SERVER_TOKEN"
PROJECT_EXCLUDES = frozenset(
    {".git", ".venv", "venv", "__pycache__", "node_modules", ".pytest_cache", ".mypy_cache", ".ruff_cache", "env.yaml"}
)
TERMINAL = frozenset({"stopped", "finished", "failed"})


class TeamServerError(NemoGymError):
    """A call to the run server failed; the message says what to do (it never carries the token)."""


@dataclasses.dataclass(frozen=True)
class ServerLogin:
    """What the ng_login file keeps about the run server."""

    url: str
    token: str = dataclasses.field(repr=False)
    user: str
    org: str | None


class OrgsOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)
    org: str | None = Field(None, description="the organization to switch to (default: list them)")
    json_output: bool = Field(False, alias="json", description="print JSON")


# -- the login -------------------------------------------------------------------------------------------------
def current_login() -> ServerLogin | None:
    """The saved run-server login, or None when not logged in."""
    entry = load_login(LOGIN_ENTRY)
    if not entry.get("url") or not entry.get("token"):
        return None
    return ServerLogin(
        url=entry["url"], token=entry["token"], user=entry.get("user", "?"), org=entry.get("org") or None
    )


def _save(login: ServerLogin) -> Path:
    return save_login(LOGIN_ENTRY, login.token, login.url, user=login.user, org=login.org or "")


def _normal_url(url: str) -> str:
    url = url.strip().rstrip("/")
    parsed = httpx.URL(url)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigError(f"+server must be an http(s) URL such as http://127.0.0.1:8280, got {url!r}")
    return url


def login_server(server: str, token: str | None = None) -> int:
    """`ng_login +server=URL`: check the token with the server, keep it, pick the active organization.

    Raises:
        ConfigError: no token available, or a bad URL. TeamServerError: the server refused the token or is down.
    """
    url = _normal_url(server)
    token = token or os.environ.get(TOKEN_ENV)
    if not token:
        if not sys.stdin or not sys.stdin.isatty():
            raise ConfigError(f"no terminal to read the token from; pass +token=... or set {TOKEN_ENV}")
        token = getpass.getpass(f"token for {url} (not echoed): ").strip()
    if not token:
        raise ConfigError("empty token: nothing saved")
    me = TeamClient(ServerLogin(url=url, token=token, user="?", org=None)).me()
    previous = current_login()
    keep = previous.org if previous and previous.url == url and previous.org in me["orgs"] else None
    login = ServerLogin(url=url, token=token, user=me["user"], org=keep or (me["orgs"][0] if me["orgs"] else None))
    path = _save(login)
    orgs = ", ".join(me["orgs"]) or "none"
    print(
        f"logged in to {url} as {login.user}; active organization: {login.org or '-'} (yours: {orgs}); token kept in"
        f" {path} (readable by you only)"
    )
    return 0


def logout_server(server: str | None) -> int:
    """`ng_logout +server=URL` (or every server when None): forget the saved login."""
    login = current_login()
    if login is None or (server and _normal_url(server) != login.url):
        print(f"not logged in to {server}" if server else "not logged in to a run server")
        return 0
    remove_login(LOGIN_ENTRY)
    print(f"logged out of {login.url}")
    return 0


def require_login() -> ServerLogin:
    login = current_login()
    if login is None:
        raise ConfigError(
            "not logged in to a run server: ng_login +server=URL (or use +local=true for this machine's runs)"
        )
    return login


def _require_org(login: ServerLogin) -> str:
    if not login.org:
        raise ConfigError(
            f"you belong to no organization on {login.url}: ask the server's admin (ng_serve +admin=add_member ...)"
        )
    return login.org


def orgs_main(options: OrgsOptions) -> int:
    """`ng_orgs`: list the user's organizations (`*` marks the active one); `ng_orgs <ORG>` switches."""
    login = require_login()
    me = TeamClient(login).me()
    if options.org is None:
        if options.json_output:
            import json

            print(json.dumps({"user": me["user"], "active": login.org, "orgs": me["orgs"]}, indent=2))
        else:
            for org in me["orgs"]:
                print(f"{'*' if org == login.org else ' '} {org}")
        return 0
    if options.org not in me["orgs"]:
        raise ConfigError(
            f"you are not a member of an organization {options.org!r} on {login.url}; yours:"
            f" {', '.join(me['orgs']) or 'none'}"
        )
    _save(dataclasses.replace(login, org=options.org))
    print(f"active organization: {options.org}")
    return 0


# -- the HTTP client -------------------------------------------------------------------------------------------
class TeamClient:
    """Calls to one run server as one user (httpx, timeouts on). Errors become TeamServerError with a hint.

    Args:
        login: server URL, token and active organization.
        timeout_s: connect/read/write deadline of each call (downloads and followed logs wait without a read limit).
    """

    def __init__(self, login: ServerLogin, timeout_s: float = 60.0):
        self.login = login
        loopback = httpx.URL(login.url).host in ("127.0.0.1", "localhost", "::1")
        self.http = httpx.Client(
            base_url=login.url,
            headers={"Authorization": f"Bearer {login.token}"},
            timeout=timeout_s,
            trust_env=not loopback,
        )

    def _org_path(self, suffix: str = "") -> str:
        return f"/v1/orgs/{_require_org(self.login)}{suffix}"

    def _check(self, answer: httpx.Response, what: str) -> httpx.Response:
        if answer.status_code == 401:
            raise TeamServerError(
                f"{self.login.url} refused the token (wrong, expired or revoked): ng_login +server={self.login.url}"
                " with a new one"
            )
        if answer.status_code == 404:
            raise TeamServerError(
                f"{what}: not found in organization {self.login.org} on {self.login.url} (ng_runs list shows its runs)"
            )
        if answer.is_error:
            try:
                detail = answer.json().get("detail", answer.text)
            except ValueError:
                detail = answer.text
            raise TeamServerError(f"{what}: the server answered {answer.status_code}: {str(detail)[:500]}")
        return answer

    def _request(self, method: str, path: str, what: str, **kwargs: Any) -> httpx.Response:
        try:
            answer = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise TeamServerError(
                f"{what}: cannot reach {self.login.url} ({type(exc).__name__}); is ng_serve running there?"
            ) from exc
        return self._check(answer, what)

    def me(self) -> dict[str, Any]:
        return self._request("GET", "/v1/me", "login check").json()

    def runs(self) -> list[dict[str, Any]]:
        return self._request("GET", self._org_path("/runs"), "list runs").json()

    def run(self, run_id: str) -> dict[str, Any]:
        return self._request("GET", self._org_path(f"/runs/{run_id}"), f"run {run_id}").json()

    def models(self) -> list[dict[str, Any]]:
        return self._request("GET", self._org_path("/models"), "list models").json()

    def submit(self, kind: str, args: list[str], project_dir: Path) -> dict[str, Any]:
        """Upload `project_dir` (a .tar.gz, PROJECT_EXCLUDES left out) and start a run in it."""
        archive = pack_project(project_dir)
        upload = self._request(
            "POST",
            self._org_path("/uploads"),
            "upload the project",
            content=archive,
            headers={"Content-Type": "application/gzip"},
        )
        body = {"kind": kind, "args": args, "upload_id": upload.json()["upload_id"]}
        return self._request("POST", self._org_path("/runs"), f"submit the {kind} run", json=body).json()

    def logs(self, run_id: str, follow: bool) -> Iterator[bytes]:
        """The run's log; with `follow`, chunks as they come until the run ends."""
        path = self._org_path(f"/runs/{run_id}/logs")
        try:
            with self.http.stream(
                "GET", path, params={"follow": str(follow).lower()}, timeout=httpx.Timeout(60.0, read=None)
            ) as answer:
                if answer.is_error:
                    answer.read()
                    self._check(answer, f"logs of run {run_id}")
                yield from answer.iter_bytes()
        except httpx.HTTPError as exc:
            raise TeamServerError(
                f"logs of run {run_id}: connection to {self.login.url} lost ({type(exc).__name__})"
            ) from exc

    def stop(self, run_id: str, save_model: bool) -> dict[str, Any]:
        return self._request(
            "POST", self._org_path(f"/runs/{run_id}/stop"), f"stop run {run_id}", json={"save_model": save_model}
        ).json()

    def delete(self, run_id: str, force: bool) -> None:
        self._request(
            "DELETE",
            self._org_path(f"/runs/{run_id}"),
            f"delete run {run_id}",
            params={"force": str(force).lower()},
            timeout=120.0,
        )

    def download_model(self, run_id: str, output: Path) -> Path:
        """The run's final/ folder unpacked as `output` (which must not exist or be empty). Returns `output`.

        Raises:
            TeamServerError: the run is still running, has no model, or the download broke off.
            ConfigError: `output` is a non-empty folder or a file.
        """
        if output.exists() and (not output.is_dir() or any(output.iterdir())):
            raise ConfigError(f"+output={output} exists and is not an empty folder; choose a new folder")
        output.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=output.parent, prefix=".ng_download_") as tmp:
            archive = Path(tmp) / "model.tar"
            try:
                with self.http.stream(
                    "GET", self._org_path(f"/runs/{run_id}/model"), timeout=httpx.Timeout(60.0, read=600.0)
                ) as answer:
                    if answer.is_error:
                        answer.read()
                        self._check(answer, f"model of run {run_id}")
                    with archive.open("wb") as handle:
                        for chunk in answer.iter_bytes():
                            handle.write(chunk)
            except httpx.HTTPError as exc:
                raise TeamServerError(
                    f"model of run {run_id}: download from {self.login.url} broke off ({type(exc).__name__}); try again"
                ) from exc
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="data")
            if output.exists():
                output.rmdir()
            shutil.move(str(Path(tmp) / "final"), output)
        return output


def pack_project(folder: Path) -> bytes:
    """`folder` as .tar.gz bytes (members relative to it), without PROJECT_EXCLUDES (VCS, virtualenvs, caches, and
    env.yaml, which holds local secrets)."""

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if any(part in PROJECT_EXCLUDES for part in Path(info.name).parts) else info

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for child in sorted(folder.iterdir()):
            tar.add(child, arcname=child.name, filter=keep)
    return buffer.getvalue()
