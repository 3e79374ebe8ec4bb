"""Shared pieces of the dataset registry: settings and tokens, the login file, checksums, atomic downloads.

Settings (tokens, URLs, organization) are looked up in this order: the command's own parameter, `env.yaml`
in the current directory, the environment variable, the `ng_login` file
(`$NEMO_GYM_HOME/credentials.json`, mode 0600). Tokens are never printed: every message that may carry a
server's text goes through `redact`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from nemo_gym.common.errors import NemoGymError
from nemo_gym.common.layout import nemo_gym_home

__all__ = [
    "RegistryError",
    "SERVICES",
    "setting",
    "token_for",
    "credentials_path",
    "load_login",
    "save_login",
    "remove_login",
    "sha256_file",
    "git_blob_sha1",
    "atomic_download",
    "redact",
    "host_of",
    "check_version",
    "confirm",
    "check_output_free",
]

# service -> (env.yaml key of the token, environment variables of the token)
SERVICES: dict[str, tuple[str, tuple[str, ...]]] = {
    "hf": ("hf_token", ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")),
    "gitlab": ("gitlab_token", ("GITLAB_TOKEN",)),
    "wandb": ("wandb_api_key", ("WANDB_API_KEY",)),
}
VERSION_RE = re.compile(r"^\d+\.\d+\.\d+$")
CHUNK_BYTES = 1 << 20


class RegistryError(NemoGymError):
    """A dataset registry operation failed; the message names the host or file and what to check."""


def _env_yaml() -> dict[str, Any]:
    path = Path.cwd() / "env.yaml"
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise RegistryError(f"{path}: not valid YAML: {exc}") from exc
    return data if isinstance(data, dict) else {}


def credentials_path() -> Path:
    """The `ng_login` file: `$NEMO_GYM_HOME/credentials.json`."""
    return nemo_gym_home() / "credentials.json"


def _logins() -> dict[str, dict[str, str]]:
    path = credentials_path()
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def setting(
    key: str, env_vars: tuple[str, ...] = (), explicit: Any = None, *, login: tuple[str, str] | None = None
) -> Any:
    """The value of a setting: `explicit`, else `env.yaml[key]`, else the first set environment variable,
    else `login=(service, field)` from the `ng_login` file; None when none has it."""
    if explicit not in (None, ""):
        return explicit
    value = _env_yaml().get(key)
    if value not in (None, ""):
        return value
    for name in env_vars:
        if os.environ.get(name):
            return os.environ[name]
    if login:
        return _logins().get(login[0], {}).get(login[1])
    return None


def token_for(service: str, explicit: str | None = None) -> str | None:
    """The token of `service` (hf, gitlab, wandb): parameter, env.yaml, environment, then the login file."""
    key, env_vars = SERVICES[service]
    value = setting(key, env_vars, explicit, login=(service, "token"))
    return str(value) if value is not None else None


def load_login(service: str) -> dict[str, str]:
    """The saved entry of `service` in the login file (`{"token", "url", ...}`), {} when there is none."""
    entry = _logins().get(service)
    return entry if isinstance(entry, dict) else {}


def save_login(service: str, token: str, url: str | None = None, **extra: str) -> Path:
    """Store `token` (and `url`, and `extra` fields) of `service` in the login file, written atomically with mode
    0600."""
    path = credentials_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    logins = _logins()
    logins[service] = {"token": token, **({"url": url} if url else {}), **extra}
    _write_private(path, json.dumps(logins, indent=2) + "\n")
    return path


def remove_login(service: str | None) -> list[str]:
    """Forget the token of `service` (every service when None). Returns the services removed."""
    logins = _logins()
    removed = [s for s in logins if service in (None, s)]
    for name in removed:
        logins.pop(name)
    if removed:
        _write_private(credentials_path(), json.dumps(logins, indent=2) + "\n")
    return removed


def _write_private(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mkstemp creates the file with mode 0600
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK_BYTES):
            yield chunk


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    for chunk in _chunks(path):
        digest.update(chunk)
    return digest.hexdigest()


def git_blob_sha1(path: Path) -> str:
    """Git's object id of a file (`sha1("blob <size>\\0" + content)`), what the Hub reports for non-LFS files."""
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    for chunk in _chunks(path):
        digest.update(chunk)
    return digest.hexdigest()


def check_output_free(output: Path, overwrite: bool) -> None:
    """Raises RegistryError when `output` exists and `overwrite` is false."""
    if output.exists() and not overwrite:
        raise RegistryError(f"{output} already exists; pass +overwrite=true to replace it")


def atomic_download(output: Path, fetch: Callable[[Path], Path], verify: Callable[[Path], None]) -> Path:
    """Download into a temporary folder next to `output`, verify, then move into place with `os.replace`.

    `fetch(tmp_dir)` downloads and returns the downloaded file; `verify(file)` raises on a checksum mismatch.
    An interrupted or failed download leaves nothing under `output` (and no temporary folder).
    """
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}.partial-"))
    try:
        downloaded = fetch(tmp_dir)
        verify(downloaded)
        os.replace(downloaded, output)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return output


def redact(text: str, secrets: list[str | None]) -> str:
    """`text` with every secret (of 4 characters or more) replaced by `****`."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "****")
    return text


def host_of(url: str) -> str:
    """`host:port` of a URL, for messages."""
    parsed = urlparse(url)
    return parsed.netloc or url


def check_version(version: str) -> str:
    """Raises RegistryError unless `version` has the form `x.y.z` (digits)."""
    if not VERSION_RE.match(version):
        raise RegistryError(f"version {version!r} is not of the form x.y.z (e.g. 0.0.1)")
    return version


def confirm(question: str, yes: bool) -> bool:
    """Ask `question [y/N]` on the terminal; True when `yes`. Raises RegistryError with no terminal (CI)."""
    if yes:
        return True
    if not sys.stdin or not sys.stdin.isatty():
        raise RegistryError(
            f"{question} needs a confirmation, but there is no terminal to ask on; pass +yes=true to confirm"
        )
    answer = input(f"{question} [y/N]: ").strip().lower()
    return answer in ("y", "yes")
