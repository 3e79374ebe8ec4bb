"""Entry point of a server process started by `nemo_gym.art.server_process.ServerProcess` (no ng_run, no head).

    python -m nemo_gym.art._serve --app responses_api_models/vllm_model/app.py --name policy \
        --config config.json --url-file url.txt

Imports the one server class of `--app`, builds it from the JSON config, binds 127.0.0.1 on a free port,
writes `http://127.0.0.1:<port>` to `--url-file` (atomically) and serves with uvicorn. The access token is
taken from `$NEMO_GYM_RUN_TOKEN` (and removed from the environment, so vLLM does not inherit it): every
route but `/health` then requires it. Exit codes: 2 config error, 3 bind error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import uvicorn

from nemo_gym.common.errors import ConfigError
from nemo_gym.serving.auth import take_run_token_from_env
from nemo_gym.serving.entrypoint import bind_socket, load_server_class
from nemo_gym.serving.limits import UVICORN_LIMITS


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--app", required=True, help="the server's app.py")
    parser.add_argument("--name", required=True, help="instance name")
    parser.add_argument("--config", required=True, help="JSON file with the server's config fields")
    parser.add_argument("--url-file", required=True, help="where to write the server's URL once bound")
    args = parser.parse_args(argv)
    run_token = take_run_token_from_env()
    try:
        cls = load_server_class(Path(args.app))
        server = cls(json.loads(Path(args.config).read_text()), name=args.name)
        sock = bind_socket("127.0.0.1", 0, args.name)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2 if "cannot bind" not in str(exc) else 3)
    except ValueError as exc:  # pydantic's ValidationError of the config
        print(f"config error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    url_file = Path(args.url_file)
    url_file.with_suffix(".tmp").write_text(url)
    os.replace(url_file.with_suffix(".tmp"), url_file)
    print(f"server {args.name} listening on {url}", flush=True)
    config = uvicorn.Config(
        server.build_app(run_token=run_token),
        log_level=os.environ.get("NEMO_GYM_LOG_LEVEL", "warning"),
        access_log=False,
        timeout_keep_alive=60,
        **UVICORN_LIMITS,
    )
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
