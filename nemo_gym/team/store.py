"""The run server's state in one SQLite file: organizations, users, bearer tokens and runs.

Tokens are `ngt_` + `secrets.token_urlsafe(32)` (256 random bits). Only their SHA-256 is stored (a fast hash is
the standard for high-entropy random tokens: there is nothing to guess, so no slow password hash is needed), and
the check compares hashes in constant time (`hmac.compare_digest`). A token can expire (`expires_at`, unix
seconds) and be revoked. The plain token exists only in the return value of `create_token`, which the admin
command prints once.

Organizations are namespaces: a user belongs to one or more; every run belongs to one organization, and every
read of a run goes through `get_run(org_id, run_id)`, so a run of another organization is simply not found.

The database file is created with mode 0600 inside a 0700 folder. Each call opens its own connection (the
server's request threads share nothing), with a busy timeout so concurrent writers wait instead of failing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import json
import os
import re
import secrets
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nemo_gym.common.errors import ConfigError

__all__ = ["TOKEN_PREFIX", "NAME_PATTERN", "User", "Token", "Run", "Store", "hash_token"]

TOKEN_PREFIX = "ngt_"
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")  # organization and user names (also used in paths)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS orgs (id TEXT PRIMARY KEY, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS users (id TEXT PRIMARY KEY, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS memberships (
    user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    org_id TEXT NOT NULL REFERENCES orgs(id) ON DELETE CASCADE,
    PRIMARY KEY (user_id, org_id));
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY, user_id TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    token_sha256 TEXT NOT NULL UNIQUE, created_at REAL NOT NULL, expires_at REAL, revoked INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, org_id TEXT NOT NULL REFERENCES orgs(id), user_id TEXT NOT NULL REFERENCES users(id),
    kind TEXT NOT NULL, args TEXT NOT NULL, submission_id TEXT NOT NULL UNIQUE, created_at REAL NOT NULL,
    stop_requested INTEGER NOT NULL DEFAULT 0, save_model INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS runs_by_org ON runs (org_id, created_at);
"""


def hash_token(token: str) -> str:
    """SHA-256 of the token, hex (64 characters): what the database holds instead of the token."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class User:
    """An authenticated user and the organizations they belong to (sorted)."""

    id: str
    orgs: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Token:
    """A token's public facts (never the token itself)."""

    id: str
    user_id: str
    created_at: float
    expires_at: float | None
    revoked: bool


@dataclasses.dataclass(frozen=True)
class Run:
    """One submitted run: `submission_id` is its Ray job's id; `args` the ng_* arguments it was started with."""

    id: str
    org_id: str
    user_id: str
    kind: str
    args: list[str]
    submission_id: str
    created_at: float
    stop_requested: bool
    save_model: bool


def check_name(kind: str, name: str) -> str:
    """`name` if it is a valid organization or user name (lower-case letters, digits, `-`, `_`; up to 63).

    Raises:
        ConfigError: the name does not match, naming what it is for.
    """
    if not NAME_PATTERN.match(name or ""):
        raise ConfigError(
            f"{kind} name {name!r} is not valid: use 1 to 63 lower-case letters, digits, '-' or '_' (starting with a"
            " letter or digit)"
        )
    return name


class Store:
    """The SQLite state of one run server (`<data_dir>/serve.db`)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not self.path.exists():
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.chmod(self.path, 0o600)
        with self._connect() as db:
            db.executescript(_SCHEMA)

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=30.0)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA foreign_keys = ON")
        try:
            with db:  # one transaction: committed on success, rolled back on an exception
                yield db
        finally:
            db.close()

    # -- admin ---------------------------------------------------------------------------------------------------
    def create_org(self, org_id: str) -> None:
        """Raises: ConfigError: a bad name or an existing organization."""
        check_name("organization", org_id)
        try:
            with self._connect() as db:
                db.execute("INSERT INTO orgs (id, created_at) VALUES (?, ?)", (org_id, time.time()))
        except sqlite3.IntegrityError as exc:
            raise ConfigError(f"organization {org_id!r} exists already") from exc

    def create_user(self, user_id: str, orgs: list[str]) -> None:
        """Create a user, member of `orgs` (each must exist).

        Raises:
            ConfigError: a bad name, an existing user, or an organization that does not exist.
        """
        check_name("user", user_id)
        try:
            with self._connect() as db:
                db.execute("INSERT INTO users (id, created_at) VALUES (?, ?)", (user_id, time.time()))
                for org in orgs:
                    self._add_member(db, user_id, org)
        except sqlite3.IntegrityError as exc:
            raise ConfigError(f"user {user_id!r} exists already") from exc

    def add_member(self, user_id: str, org_id: str) -> None:
        """Raises: ConfigError: no such user or organization."""
        with self._connect() as db:
            if not db.execute("SELECT 1 FROM users WHERE id = ?", (user_id,)).fetchone():
                raise ConfigError(
                    f"no user {user_id!r} (create it with ng_serve +admin=create_user +user={user_id} +org=...)"
                )
            self._add_member(db, user_id, org_id)

    @staticmethod
    def _add_member(db: sqlite3.Connection, user_id: str, org_id: str) -> None:
        if not db.execute("SELECT 1 FROM orgs WHERE id = ?", (org_id,)).fetchone():
            raise ConfigError(f"no organization {org_id!r} (create it with ng_serve +admin=create_org +org={org_id})")
        db.execute("INSERT OR IGNORE INTO memberships (user_id, org_id) VALUES (?, ?)", (user_id, org_id))

    def create_token(self, user_id: str, expires_in_s: float | None = None) -> tuple[str, Token]:
        """A new bearer token for `user_id`: `(token, its public facts)`. The token is returned here only.

        Raises:
            ConfigError: no such user, or a non-positive lifetime.
        """
        if expires_in_s is not None and expires_in_s <= 0:
            raise ConfigError(f"token lifetime must be positive, got {expires_in_s} s")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        now = time.time()
        facts = Token(
            id=secrets.token_hex(6),
            user_id=user_id,
            created_at=now,
            expires_at=now + expires_in_s if expires_in_s else None,
            revoked=False,
        )
        with self._connect() as db:
            if not db.execute("SELECT 1 FROM users WHERE id = ?", (user_id,)).fetchone():
                raise ConfigError(
                    f"no user {user_id!r} (create it with ng_serve +admin=create_user +user={user_id} +org=...)"
                )
            db.execute(
                "INSERT INTO tokens (id, user_id, token_sha256, created_at, expires_at) VALUES (?, ?, ?, ?, ?)",
                (facts.id, user_id, hash_token(token), facts.created_at, facts.expires_at),
            )
        return token, facts

    def revoke_token(self, token_id: str) -> None:
        """Raises: ConfigError: no such token id."""
        with self._connect() as db:
            if db.execute("UPDATE tokens SET revoked = 1 WHERE id = ?", (token_id,)).rowcount == 0:
                raise ConfigError(f"no token with id {token_id!r} (ng_serve +admin=list shows them)")

    def describe(self) -> dict[str, Any]:
        """Organizations with their members, and tokens (id, user, expiry, revoked; never a hash or a token)."""
        with self._connect() as db:
            orgs = {r["id"]: [] for r in db.execute("SELECT id FROM orgs ORDER BY id")}
            for row in db.execute("SELECT user_id, org_id FROM memberships ORDER BY user_id"):
                orgs[row["org_id"]].append(row["user_id"])
            tokens = [
                dict(r) | {"revoked": bool(r["revoked"])}
                for r in db.execute(
                    "SELECT id, user_id, created_at, expires_at, revoked FROM tokens ORDER BY created_at"
                )
            ]
        return {"orgs": orgs, "tokens": tokens}

    # -- authentication ------------------------------------------------------------------------------------------
    def authenticate(self, token: str | None, now: float | None = None) -> User | None:
        """The user holding `token`, or None for a missing, unknown, expired or revoked token (the caller answers
        401 without saying which)."""
        if not token or not token.startswith(TOKEN_PREFIX) or len(token) > 256:
            return None
        digest = hash_token(token)
        with self._connect() as db:
            row = db.execute(
                "SELECT user_id, token_sha256, expires_at, revoked FROM tokens WHERE token_sha256 = ?", (digest,)
            ).fetchone()
            if row is None or not hmac.compare_digest(row["token_sha256"], digest):
                return None
            if row["revoked"] or (
                row["expires_at"] is not None and row["expires_at"] <= (now if now is not None else time.time())
            ):
                return None
            orgs = tuple(
                r["org_id"]
                for r in db.execute(
                    "SELECT org_id FROM memberships WHERE user_id = ? ORDER BY org_id", (row["user_id"],)
                )
            )
        return User(id=row["user_id"], orgs=orgs)

    # -- runs ----------------------------------------------------------------------------------------------------
    def add_run(self, run_id: str, org_id: str, user_id: str, kind: str, args: list[str], submission_id: str) -> Run:
        with self._connect() as db:
            db.execute(
                "INSERT INTO runs (id, org_id, user_id, kind, args, submission_id, created_at) VALUES (?, ?, ?, ?, ?,"
                " ?, ?)",
                (run_id, org_id, user_id, kind, json.dumps(args), submission_id, time.time()),
            )
        run = self.get_run(org_id, run_id)
        assert run is not None
        return run

    def get_run(self, org_id: str, run_id: str) -> Run | None:
        """The run `run_id` of organization `org_id`; None when it does not exist *in that organization*."""
        with self._connect() as db:
            row = db.execute("SELECT * FROM runs WHERE id = ? AND org_id = ?", (run_id, org_id)).fetchone()
        return _run(row) if row else None

    def list_runs(self, org_id: str) -> list[Run]:
        """The organization's runs, newest first."""
        with self._connect() as db:
            rows = db.execute("SELECT * FROM runs WHERE org_id = ? ORDER BY created_at DESC", (org_id,)).fetchall()
        return [_run(r) for r in rows]

    def all_runs(self) -> list[Run]:
        """Every organization's runs (for the server's own housekeeping, never for an answer)."""
        with self._connect() as db:
            return [_run(r) for r in db.execute("SELECT * FROM runs ORDER BY created_at").fetchall()]

    def mark_stop(self, org_id: str, run_id: str, save_model: bool) -> None:
        with self._connect() as db:
            db.execute(
                "UPDATE runs SET stop_requested = 1, save_model = ? WHERE id = ? AND org_id = ?",
                (int(save_model), run_id, org_id),
            )

    def delete_run(self, org_id: str, run_id: str) -> None:
        with self._connect() as db:
            db.execute("DELETE FROM runs WHERE id = ? AND org_id = ?", (run_id, org_id))


def _run(row: sqlite3.Row) -> Run:
    return Run(
        id=row["id"],
        org_id=row["org_id"],
        user_id=row["user_id"],
        kind=row["kind"],
        args=json.loads(row["args"]),
        submission_id=row["submission_id"],
        created_at=row["created_at"],
        stop_requested=bool(row["stop_requested"]),
        save_model=bool(row["save_model"]),
    )
