"""The run server without Ray: the SQLite store (hashed tokens, expiry, file modes), the API over real HTTP on
127.0.0.1 with a fake of the Ray side (`FakeRay`, the only fake: Ray is the external service), and the client
commands (ng_login +server, ng_orgs, ng_runs against the server, ng_train +remote=true, ng_status, ng_logout).

The same run routes are exercised against a real Ray cluster in tests/test_team_ray.py (marker ray).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import sqlite3
import stat
import tarfile
import time
from pathlib import Path

import httpx
import pytest
from live_servers import serve

from nemo_gym.cli import main
from nemo_gym.common.errors import ConfigError
from nemo_gym.team.client import ServerLogin, TeamClient, TeamServerError, pack_project
from nemo_gym.team.remote_runs import list_server_models
from nemo_gym.team.server import build_app, mask_secret_args
from nemo_gym.team.store import Store, hash_token


@dataclasses.dataclass
class FakeJob:
    status: str
    driver_node_id: str | None = "node-1"
    message: str | None = None
    start_time: int | None = None
    end_time: int | None = None
    driver_exit_code: int | None = None


class FakeRay:
    """The RayBackend interface over a dict: a submitted job runs until stopped; a stop with save_model leaves a
    final/ folder; what each submission's working directory held is recorded."""

    def __init__(self) -> None:
        self.jobs_: dict[str, FakeJob] = {}
        self.uploaded: dict[str, list[str]] = {}
        self.entry: dict[str, tuple[str, list[str]]] = {}
        self.finals: dict[str, bytes] = {}
        self.deleted: list[str] = []

    def submit(self, run_id, kind, argv, working_dir, metadata):
        sid = f"ng-{run_id}"
        self.uploaded[run_id] = sorted(str(p.relative_to(working_dir)) for p in working_dir.rglob("*") if p.is_file())
        self.entry[run_id] = (kind, list(argv))
        self.jobs_[sid] = FakeJob("RUNNING", start_time=int(time.time() * 1000))
        return sid

    def jobs(self):
        return dict(self.jobs_)

    def job(self, sid):
        return self.jobs_.get(sid)

    def logs(self, sid):
        return f"log of {sid}\n"

    async def tail(self, sid):
        for line in ("step 1\n", "step 2\n"):
            yield line

    def request_stop(self, run_id, sid, node_id, save_model):
        self.jobs_[sid].status = "STOPPED"
        if save_model:
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as tar:
                data = b"weights of " + run_id.encode()
                info = tarfile.TarInfo("final/model.safetensors")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            self.finals[run_id] = buffer.getvalue()

    def delete(self, run_id, sid, node_id):
        self.deleted.append(run_id)
        self.jobs_.pop(sid, None)

    def fetch_final(self, run_id, node_id):
        return self.finals.get(run_id)


@pytest.fixture
def team(tmp_path):
    """A served app with two organizations (acme: alice; globex: bob) and their tokens."""
    store = Store(tmp_path / "serve" / "serve.db")
    store.create_org("acme")
    store.create_org("globex")
    store.create_user("alice", ["acme"])
    store.create_user("bob", ["globex"])
    alice, _ = store.create_token("alice")
    bob, _ = store.create_token("bob", expires_in_s=3600)
    ray = FakeRay()
    app = build_app(store, ray, tmp_path / "serve" / "orgs", max_upload_bytes=1 << 20, harvest_interval_s=0.1)
    with serve(app) as url:
        yield {"url": url, "store": store, "ray": ray, "alice": alice, "bob": bob, "tmp": tmp_path}


def project(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "train.yaml").write_text("trainer: {num_steps: 1}\n")
    (folder / "env.yaml").write_text("policy_api_key: sk-secret\n")  # local secrets: never uploaded
    (folder / ".git").mkdir()
    (folder / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return folder


# -- store --------------------------------------------------------------------------------------------------------
def test_store_keeps_only_token_hashes_with_private_file_modes(tmp_path):
    store = Store(tmp_path / "data" / "serve.db")
    store.create_org("acme")
    store.create_user("alice", ["acme"])
    token, facts = store.create_token("alice", expires_in_s=60)
    assert token.startswith("ngt_") and len(token) == 4 + 43  # token_urlsafe(32): 43 characters
    assert stat.S_IMODE((tmp_path / "data").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "data" / "serve.db").stat().st_mode) == 0o600
    raw = (tmp_path / "data" / "serve.db").read_bytes()
    assert token.encode() not in raw and hashlib.sha256(token.encode()).hexdigest().encode() in raw
    [row] = sqlite3.connect(tmp_path / "data" / "serve.db").execute("SELECT token_sha256 FROM tokens").fetchall()
    assert row[0] == hash_token(token)
    assert store.authenticate(token).id == "alice" and store.authenticate(token).orgs == ("acme",)
    assert store.authenticate(token, now=facts.expires_at + 1) is None  # expired
    assert store.authenticate(token[:-1] + ("A" if token[-1] != "A" else "B")) is None
    assert (
        store.authenticate("") is None
        and store.authenticate(None) is None
        and store.authenticate("ngt_" + "x" * 300) is None
    )
    store.revoke_token(facts.id)
    assert store.authenticate(token) is None
    assert token not in json.dumps(store.describe()) and store.describe()["orgs"] == {"acme": ["alice"]}


def test_store_rejects_bad_names_duplicates_and_unknown_references(tmp_path):
    store = Store(tmp_path / "serve.db")
    with pytest.raises(ConfigError, match="not valid"):
        store.create_org("../etc")
    store.create_org("acme")
    with pytest.raises(ConfigError, match="exists already"):
        store.create_org("acme")
    with pytest.raises(ConfigError, match="no organization 'nope'"):
        store.create_user("alice", ["nope"])
    with pytest.raises(ConfigError, match="no user 'carol'"):
        store.create_token("carol")
    store.create_user("alice", ["acme"])
    with pytest.raises(ConfigError, match="lifetime must be positive"):
        store.create_token("alice", expires_in_s=-1)


def test_secret_arguments_are_masked_in_listings():
    assert mask_secret_args(
        ["+trainer.num_steps=2", "+policy_api_key=sk-1", "++wandb.api_key=x", "+max_output_tokens=8"]
    ) == ["+trainer.num_steps=2", "+policy_api_key=****", "++wandb.api_key=****", "+max_output_tokens=8"]


# -- API ----------------------------------------------------------------------------------------------------------
def test_unauthorized_answers_say_nothing(team):
    url = team["url"]
    expired, facts = team["store"].create_token("alice", expires_in_s=0.2)
    time.sleep(0.3)
    answers = [
        httpx.get(f"{url}/v1/me"),
        httpx.get(f"{url}/v1/me", headers={"Authorization": "Bearer ngt_wrong"}),
        httpx.get(f"{url}/v1/me", headers={"Authorization": f"Bearer {expired}"}),
        httpx.get(f"{url}/v1/orgs/acme/runs", headers={"Authorization": f"Basic {team['alice']}"}),
        httpx.post(
            f"{url}/v1/orgs/acme/runs", headers={"Authorization": "Bearer x"}, json={"kind": "train", "upload_id": "a"}
        ),
    ]
    assert [a.status_code for a in answers] == [401] * 5
    assert {a.text for a in answers} == {'{"detail":"unauthorized"}'}
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    assert httpx.get(f"{url}/v1/me", headers={"Authorization": f"Bearer {team['alice']}"}).json() == {
        "user": "alice",
        "orgs": ["acme"],
    }


def test_runs_of_one_organization_are_invisible_to_another(team):
    alice = TeamClient(ServerLogin(team["url"], team["alice"], "alice", "acme"))
    bob = TeamClient(ServerLogin(team["url"], team["bob"], "bob", "globex"))
    run = alice.submit("train", ["+config_paths=[train.yaml]", "+policy_api_key=sk-1"], project(team["tmp"] / "proj"))
    assert run["status"] == "running" and run["user"] == "alice" and run["args"][1] == "+policy_api_key=****"
    assert team["ray"].uploaded[run["id"]] == ["train.yaml"]  # no env.yaml, no .git
    assert team["ray"].entry[run["id"]] == ("train", ["+config_paths=[train.yaml]", "+policy_api_key=sk-1"])
    assert [r["id"] for r in alice.runs()] == [run["id"]] and bob.runs() == []
    assert b"".join(alice.logs(run["id"], follow=True)) == b"step 1\nstep 2\n"
    assert b"".join(alice.logs(run["id"], follow=False)) == f"log of ng-{run['id']}\n".encode()

    headers = {"Authorization": f"Bearer {team['bob']}"}
    base = team["url"]
    unknown = run["id"][:-4] + "ffff" if not run["id"].endswith("ffff") else run["id"][:-4] + "eeee"
    for rid in (run["id"], unknown):  # another organization's run and a run that does not exist: the same 404
        for method, path in [("GET", ""), ("GET", "/logs"), ("POST", "/stop"), ("DELETE", ""), ("GET", "/model")]:
            answer = httpx.request(
                method,
                f"{base}/v1/orgs/globex/runs/{rid}{path}",
                headers=headers,
                json={} if method == "POST" else None,
            )
            assert (answer.status_code, answer.json()) == (404, {"detail": "not found"}), (method, path)
    for method, path in [("GET", "/runs"), ("GET", f"/runs/{run['id']}"), ("GET", "/models"), ("POST", "/uploads")]:
        answer = httpx.request(method, f"{base}/v1/orgs/acme{path}", headers=headers)  # bob is no member of acme
        assert (answer.status_code, answer.json()) == (404, {"detail": "not found"}), path
        assert httpx.request(method, f"{base}/v1/orgs/nowhere{path}", headers=headers).json() == {"detail": "not found"}
    with pytest.raises(TeamServerError, match="not found"):
        bob.stop(run["id"], save_model=True)
    assert team["ray"].jobs_[f"ng-{run['id']}"].status == "RUNNING"  # bob's stop never reached Ray

    with pytest.raises(TeamServerError, match="409.*ready once it ends"):
        alice.download_model(run["id"], team["tmp"] / "early")
    assert alice.stop(run["id"], save_model=True)["status"] == "stopped"
    deadline = time.monotonic() + 10
    while not alice.models() and time.monotonic() < deadline:  # the ended run's model is copied into storage
        time.sleep(0.1)
    assert [m["run_id"] for m in alice.models()] == [run["id"]] and alice.run(run["id"])["model_stored"]
    model = alice.download_model(run["id"], team["tmp"] / "model")
    assert (model / "model.safetensors").read_bytes() == b"weights of " + run["id"].encode()
    stored = team["tmp"] / "serve" / "orgs" / "acme" / "models" / f"{run['id']}.tar"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert [m["run_id"] for m in alice.models()] == [run["id"]] and bob.models() == []
    alice.delete(run["id"], force=False)
    assert team["ray"].deleted == [run["id"]] and alice.runs() == [] and not stored.exists()


def test_uploads_are_checked(team):
    headers = {"Authorization": f"Bearer {team['alice']}"}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    answer = httpx.post(f"{team['url']}/v1/orgs/acme/uploads", headers=headers, content=buffer.getvalue())
    assert answer.status_code == 400 and "not a usable" in answer.json()["detail"]
    assert not (team["tmp"] / "serve" / "orgs" / "acme" / "escape.txt").exists()
    assert httpx.post(f"{team['url']}/v1/orgs/acme/uploads", headers=headers, content=b"not a tar").status_code == 400
    answer = httpx.post(f"{team['url']}/v1/orgs/acme/uploads", headers=headers, content=b"\0" * (2 << 20))
    assert answer.status_code == 413
    bob_upload = httpx.post(
        f"{team['url']}/v1/orgs/globex/uploads",
        headers={"Authorization": f"Bearer {team['bob']}"},
        content=pack_project(project(team["tmp"] / "p")),
    )
    answer = httpx.post(
        f"{team['url']}/v1/orgs/acme/runs",
        headers=headers,
        json={"kind": "train", "args": [], "upload_id": bob_upload.json()["upload_id"]},
    )
    assert answer.status_code == 404  # another organization's upload


# -- commands -----------------------------------------------------------------------------------------------------
def test_login_orgs_runs_status_and_logout_commands(team, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NEMO_GYM_HOME", str(tmp_path / "home"))
    store, url = team["store"], team["url"]
    store.create_org("initech")
    store.add_member("alice", "initech")
    assert main("login", [f"+server={url}", "+token=ngt_wrong"]) == 2
    assert "refused the token" in capsys.readouterr().err
    monkeypatch.setenv("NEMO_GYM_SERVER_TOKEN", team["alice"])
    assert main("login", [f"+server={url}/"]) == 0
    credentials = tmp_path / "home" / "credentials.json"
    assert stat.S_IMODE(credentials.stat().st_mode) == 0o600
    assert json.loads(credentials.read_text())["ng_serve"] == {
        "token": team["alice"],
        "url": url,
        "user": "alice",
        "org": "acme",
    }
    assert main("orgs", []) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == ["* acme", "  initech"]
    assert main("orgs", ["globex"]) == 2 and "not a member" in capsys.readouterr().err
    assert main("orgs", ["initech"]) == 0 and main("orgs", ["acme"]) == 0

    folder = project(tmp_path / "proj")
    monkeypatch.chdir(folder)
    assert main("train", ["+remote=true", "+config_paths=[../elsewhere.yaml]"]) == 2
    assert "inside the project folder" in capsys.readouterr().err
    capsys.readouterr()
    assert main("train", ["+remote=true", "+config_paths=[train.yaml]"]) == 0
    run_id = capsys.readouterr().out.strip()
    assert run_id.startswith("train-") and team["ray"].entry[run_id] == ("train", ["+config_paths=[train.yaml]"])
    assert main("runs", ["list"]) == 0 and run_id in capsys.readouterr().out  # logged in: the server's runs
    assert main("runs", ["list", "+local=true"]) == 0 and "No background runs" in capsys.readouterr().out
    assert main("runs", ["list", "+local=true", "+remote=true"]) == 2
    assert main("status", []) in (0, 1)
    shown = capsys.readouterr()
    assert f"Run server {url}: logged in as alice, organization acme" in shown.out and "1 active" in shown.out
    assert main("runs", ["stop", run_id, "+save_model=true", "+timeout_s=10"]) == 0
    assert "download its model" in capsys.readouterr().out
    assert main("runs", ["download", run_id, f"+output={tmp_path / 'm'}"]) == 0
    assert (tmp_path / "m" / "model.safetensors").is_file()
    assert [m["run_id"] for m in list_server_models()] == [run_id]
    assert main("runs", ["logs", run_id]) == 0 and f"log of ng-{run_id}" in capsys.readouterr().out
    assert main("runs", ["delete", run_id]) == 0
    out, err = capsys.readouterr()
    assert team["alice"] not in out + err
    assert main("logout", [f"+server={url}"]) == 0
    assert "ng_serve" not in json.loads(credentials.read_text()) and list_server_models() == []
    assert main("runs", ["list", "+remote=true"]) == 2 and "not logged in" in capsys.readouterr().err


def test_admin_commands_print_a_token_once(tmp_path, capsys):
    data = f"+data_dir={tmp_path / 'srv'}"
    assert main("serve", ["+admin=create_org", "+org=acme", data]) == 0
    assert main("serve", ["create_user", "+user=alice", "+org=acme", data]) == 0  # the action as a bare argument
    assert main("serve", ["+admin=create_user", "+user=alice", data]) == 2 and "needs +org" in capsys.readouterr().err
    assert main("serve", ["+admin=create_token", "+user=alice", "+expires_in_days=1", data]) == 0
    captured = capsys.readouterr()
    token = captured.out.strip().splitlines()[-1]
    assert token.startswith("ngt_") and "expires" in captured.err and token not in captured.err
    assert Store(tmp_path / "srv" / "serve.db").authenticate(token).id == "alice"
    assert main("serve", ["+admin=list", data]) == 0 and token not in capsys.readouterr().out


@pytest.mark.parametrize("name", ["serve", "orgs", "login", "runs"])
def test_team_commands_document_every_parameter(name, capsys):
    from nemo_gym.cli import COMMANDS

    assert main(name, ["+help=true"]) == 0
    text = capsys.readouterr().out
    for field, info in COMMANDS[name].options().model_fields.items():
        assert info.description and f"+{info.alias or field}:" in text, field
