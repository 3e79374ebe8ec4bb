"""`ng_login` / `ng_logout`: keep a service's token in `$NEMO_GYM_HOME/credentials.json` (mode 0600).

`+service=hf|gitlab|wandb` for the dataset registries and W&B; `+server=URL` for a team run server (`ng_serve`,
see nemo_gym.team.client: the token is checked with the server before it is kept).

The token is read from the terminal without echo (or from `+token=...`, or the service's environment
variable, for scripts); it is never printed.
"""

from __future__ import annotations

import getpass
import os
import sys
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.datasets.common import SERVICES, RegistryError, credentials_path, remove_login, save_login
from nemo_gym.team.client import login_server, logout_server

__all__ = ["LoginOptions", "LogoutOptions", "login_main", "logout_main"]


class LoginOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)
    service: Literal["hf", "gitlab", "wandb"] | None = Field(None, description="hf (Hugging Face Hub), gitlab or wandb")
    server: str | None = Field(None, description="a run server's URL (ng_serve), instead of +service")
    token: str | None = Field(
        None, description="the token (default: asked on the terminal, or taken from the service's environment variable)"
    )
    url: str | None = Field(None, description="GitLab URL to remember with the token (gitlab only)")


class LogoutOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)
    service: Literal["hf", "gitlab", "wandb"] | None = Field(None, description="service to forget (default: all)")
    server: str | None = Field(None, description="forget the login to this run server (ng_serve)")


def _read_token(service: str) -> str:
    env_vars = SERVICES[service][1]
    from_env = next((os.environ[name] for name in env_vars if os.environ.get(name)), None)
    if from_env:
        return from_env
    if not sys.stdin or not sys.stdin.isatty():
        raise RegistryError(
            f"no terminal to read the {service} token from; pass +token=... or set {' / '.join(env_vars)}"
        )
    token = getpass.getpass(f"{service} token (not echoed): ").strip()
    if not token:
        raise RegistryError("empty token: nothing saved")
    return token


def login_main(options: LoginOptions) -> int:
    if options.server:
        if options.service or options.url:
            raise RegistryError("+server=URL logs in to a run server; give it without +service / +url")

        return login_server(options.server, options.token)
    if options.service is None:
        raise RegistryError("ng_login needs +service=hf|gitlab|wandb or +server=URL (a run server)")
    if options.url and options.service != "gitlab":
        raise RegistryError("+url is only for +service=gitlab")
    token = options.token or _read_token(options.service)
    path = save_login(options.service, token, options.url)
    print(f"{options.service} token saved in {path} (readable by you only)")
    return 0


def logout_main(options: LogoutOptions) -> int:
    if options.server:
        return logout_server(options.server)
    removed = remove_login(options.service)
    print(f"forgot {', '.join(removed)} in {credentials_path()}" if removed else "no saved token to forget")
    return 0
