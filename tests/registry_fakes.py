"""Local stand-ins for the Hugging Face Hub and a GitLab instance (the real ones cannot be reached here).

Each speaks the real HTTP API, but only the endpoints that `huggingface_hub` and `python-gitlab` call for the
dataset registry: Hub `POST /api/repos/create`, `/api/collections[...]`, `preupload`, `commit` (ndjson,
regular base64 files), `paths-info`, `revision` (dataset info), `HEAD/GET .../resolve/...` (with `X-Repo-Commit` and
`ETag`); GitLab
v4 generic packages `PUT/GET .../packages/generic/:name/:version/:file`, `GET .../packages`,
`GET .../packages/:id/package_files`, `DELETE .../packages/:id`. Both check the token and can serve corrupted
or truncated bytes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qs

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

__all__ = ["FakeHub", "FakeGitlab"]


def _blob_sha1(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


def _damage(data: bytes) -> bytes:
    return data[:-2] + bytes([data[-2] ^ 0xFF]) + data[-1:] if len(data) > 2 else b"x"


def _truncated_stream(data: bytes):
    yield data[: len(data) // 2]
    raise ConnectionAbortedError("fake server dropped the connection mid-stream")


@dataclass
class FakeHub:
    """The Hub's dataset-repo API. `repos[repo_id] = {"private": bool, "files": {path: bytes}, "commit": sha}`."""

    token: str
    repos: dict[str, dict] = field(default_factory=dict)
    collections: dict[str, dict] = field(default_factory=dict)
    corrupt: bool = False

    def _authorized(self, request: Request) -> bool:
        return request.headers.get("authorization") == f"Bearer {self.token}"

    def _repo(self, request: Request, namespace: str, name: str) -> dict | Response:
        if not self._authorized(request):
            return JSONResponse({"error": "Invalid credentials in Authorization header"}, 401)
        repo = self.repos.get(f"{namespace}/{name}")
        if repo is None:
            return JSONResponse({"error": "Repository not found"}, 404, headers={"X-Error-Code": "RepoNotFound"})
        return repo

    def _collection(self, slug: str) -> dict:
        c = self.collections[slug]
        items = [{"_id": f"item{i}", "id": item, "type": "dataset", "position": i} for i, item in enumerate(c["items"])]
        return {
            "slug": slug,
            "title": c["title"],
            "owner": {"name": slug.split("/")[0]},
            "items": items,
            "lastUpdated": "2025-01-01T00:00:00.000Z",
            "position": 0,
            "private": c["private"],
            "theme": "blue",
            "upvotes": 0,
        }

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/api/repos/create")
        async def create_repo(request: Request):
            if not self._authorized(request):
                return JSONResponse({"error": "Invalid credentials"}, 401)
            body = await request.json()
            repo_id = f"{body['organization']}/{body['name']}"
            url = f"{request.base_url}datasets/{repo_id}"
            if repo_id in self.repos:
                return JSONResponse({"error": "You already created this dataset repo", "url": url}, 409)
            self.repos[repo_id] = {
                "private": body.get("visibility") == "private" or bool(body.get("private")),
                "type": body.get("type"),
                "files": {},
                "commit": "0" * 40,
            }
            return {"url": url, "name": repo_id}

        @app.post("/api/collections")
        async def create_collection(request: Request):
            body = await request.json()
            for slug, c in self.collections.items():
                if c["title"] == body["title"] and slug.startswith(body["namespace"] + "/"):
                    return JSONResponse({"error": "Collection already exists", "slug": slug}, 409)
            slug = f"{body['namespace']}/{body['title'].lower().replace(' ', '-')}-{len(self.collections):024x}"
            self.collections[slug] = {"title": body["title"], "private": body.get("private", False), "items": []}
            return self._collection(slug)

        @app.get("/api/collections/{namespace}/{rest}")
        async def get_collection(namespace: str, rest: str):
            slug = f"{namespace}/{rest}"
            return self._collection(slug) if slug in self.collections else JSONResponse({"error": "not found"}, 404)

        @app.post("/api/collections/{namespace}/{rest}/items")
        async def add_item(namespace: str, rest: str, request: Request):
            slug = f"{namespace}/{rest}"
            if not self._authorized(request):
                return JSONResponse({"error": "Invalid credentials"}, 401)
            if slug not in self.collections:
                return JSONResponse({"error": "Collection not found"}, 404)
            item = (await request.json())["item"]
            if item["id"] in self.collections[slug]["items"]:
                return JSONResponse({"error": "Item already in collection"}, 409)
            self.collections[slug]["items"].append(item["id"])
            return self._collection(slug)

        @app.post("/api/datasets/{namespace}/{name}/preupload/{revision}")
        async def preupload(namespace: str, name: str, revision: str, request: Request):
            repo = self._repo(request, namespace, name)
            if isinstance(repo, Response):
                return repo
            files = (await request.json())["files"]
            return {
                "files": [
                    {
                        "path": f["path"],
                        "uploadMode": "regular",
                        "shouldIgnore": False,
                        "oid": _blob_sha1(repo["files"][f["path"]]) if f["path"] in repo["files"] else None,
                    }
                    for f in files
                ]
            }

        @app.post("/api/datasets/{namespace}/{name}/commit/{revision}")
        async def commit(namespace: str, name: str, revision: str, request: Request):
            repo = self._repo(request, namespace, name)
            if isinstance(repo, Response):
                return repo
            for line in (await request.body()).splitlines():
                item = json.loads(line)
                if item["key"] == "file":
                    repo["files"][item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                elif item["key"] != "header":
                    return JSONResponse({"error": f"unsupported commit operation {item['key']}"}, 400)
            repo["commit"] = hashlib.sha1(repr(sorted(repo["files"].items())).encode()).hexdigest()
            return {
                "commitUrl": f"{request.base_url}datasets/{namespace}/{name}/commit/{repo['commit']}",
                "commitOid": repo["commit"],
                "pullRequestUrl": None,
            }

        @app.post("/api/datasets/{namespace}/{name}/paths-info/{revision}")
        async def paths_info(namespace: str, name: str, revision: str, request: Request):
            repo = self._repo(request, namespace, name)
            if isinstance(repo, Response):
                return repo
            paths = parse_qs((await request.body()).decode()).get("paths", [])
            return [
                {"type": "file", "path": p, "size": len(repo["files"][p]), "oid": _blob_sha1(repo["files"][p])}
                for p in paths
                if p in repo["files"]
            ]

        @app.get("/api/datasets/{namespace}/{name}/revision/{revision}")
        async def dataset_info(namespace: str, name: str, revision: str, request: Request):
            repo = self._repo(request, namespace, name)
            if isinstance(repo, Response):
                return repo
            return {
                "id": f"{namespace}/{name}",
                "sha": repo["commit"],
                "private": repo["private"],
                "siblings": [{"rfilename": path} for path in repo["files"]],
            }

        @app.api_route("/datasets/{namespace}/{name}/resolve/{revision}/{path:path}", methods=["GET", "HEAD"])
        async def resolve(namespace: str, name: str, revision: str, path: str, request: Request):
            repo = self._repo(request, namespace, name)
            if isinstance(repo, Response):
                return repo
            if path not in repo["files"]:
                return JSONResponse(
                    {"error": "Entry not found"},
                    404,
                    headers={"X-Error-Code": "EntryNotFound", "X-Repo-Commit": repo["commit"]},
                )
            data = repo["files"][path]
            headers = {
                "X-Repo-Commit": repo["commit"],
                "ETag": f'"{_blob_sha1(data)}"',
                "Content-Length": str(len(data)),
            }
            if request.method == "HEAD":
                return Response(headers=headers)
            return Response(
                _damage(data) if self.corrupt else data, headers=headers, media_type="application/octet-stream"
            )

        return app


@dataclass
class FakeGitlab:
    """A GitLab project's generic package registry (API v4). `packages[id] = {name, version, files: [..]}`."""

    token: str
    project_id: int = 7
    packages: dict[int, dict] = field(default_factory=dict)
    corrupt: bool = False
    truncate: bool = False
    report_sha256: bool = True
    _next_id: int = 1

    def _find(self, name: str, version: str) -> dict | None:
        return next((p for p in self.packages.values() if p["name"] == name and p["version"] == version), None)

    def app(self) -> FastAPI:
        app = FastAPI()
        base = f"/api/v4/projects/{self.project_id}/packages"

        @app.middleware("http")
        async def auth(request: Request, call_next):
            if request.headers.get("private-token") != self.token:
                return JSONResponse({"message": "401 Unauthorized"}, 401)
            return await call_next(request)

        @app.put(base + "/generic/{name}/{version}/{file_name}")
        async def upload(name: str, version: str, file_name: str, request: Request):
            data = await request.body()
            package = self._find(name, version)
            if package is None:
                package = self.packages[self._next_id] = {
                    "id": self._next_id,
                    "name": name,
                    "version": version,
                    "files": [],
                }
                self._next_id += 1
            record = {
                "id": self._next_id,
                "package_id": package["id"],
                "file_name": file_name,
                "size": len(data),
                "file_md5": hashlib.md5(data).hexdigest(),
                "file_sha1": hashlib.sha1(data).hexdigest(),
                "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
            if self.report_sha256:
                record["file_sha256"] = hashlib.sha256(data).hexdigest()
            self._next_id += 1
            package["files"].append({**record, "data": data})
            if request.query_params.get("select") == "package_file":
                return JSONResponse(record, 201)
            return JSONResponse({"message": "201 Created"}, 201)

        @app.get(base + "/generic/{name}/{version}/{file_name}")
        async def download(name: str, version: str, file_name: str):
            package = self._find(name, version)
            files = [f for f in (package or {}).get("files", []) if f["file_name"] == file_name]
            if not files:
                return JSONResponse({"message": "404 Not Found"}, 404)
            data = files[-1]["data"]
            if self.truncate:
                return StreamingResponse(
                    _truncated_stream(data),
                    headers={"Content-Length": str(len(data))},
                    media_type="application/octet-stream",
                )
            return Response(_damage(data) if self.corrupt else data, media_type="application/octet-stream")

        @app.get(base)
        async def list_packages(package_name: str | None = None, package_type: str | None = None):
            return [
                {
                    "id": p["id"],
                    "name": p["name"],
                    "version": p["version"],
                    "package_type": "generic",
                    "status": "default",
                }
                for p in self.packages.values()
                if package_name is None or package_name in p["name"]
            ]

        @app.get(base + "/{package_id}/package_files")
        async def package_files(package_id: int):
            if package_id not in self.packages:
                return JSONResponse({"message": "404 Not Found"}, 404)
            return [{k: v for k, v in f.items() if k != "data"} for f in self.packages[package_id]["files"]]

        @app.delete(base + "/{package_id}")
        async def delete(package_id: int):
            if self.packages.pop(package_id, None) is None:
                return JSONResponse({"message": "404 Not Found"}, 404)
            return Response(status_code=204)

        return app
