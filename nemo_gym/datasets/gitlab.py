"""Datasets in a GitLab project's generic package registry (available on every self-hosted GitLab).

A dataset is a generic package: package name = dataset name, package version = dataset version (`x.y.z`),
one JSONL file per version (`PUT /projects/:id/packages/generic/:name/:version/:file`) and a `<file>.sha256`
file next to it. Downloads are checked against the package file's sha256 from the packages API
(`file_sha256`, or the `.sha256` file on GitLabs that do not report it).

Settings: `gitlab_url` (env.yaml, `GITLAB_URL`, or `ng_login +service=gitlab +url=...`),
`gitlab_project_id` (env.yaml or `GITLAB_PROJECT_ID`; a number or `group/project`), `gitlab_token`
(env.yaml, `GITLAB_TOKEN` or `ng_login`; a token with the `api` scope).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gitlab
import requests
from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.common.paths import check_name, resolve_inside
from nemo_gym.datasets.common import (
    RegistryError,
    atomic_download,
    check_output_free,
    check_version,
    confirm,
    host_of,
    redact,
    setting,
    sha256_file,
    token_for,
)

__all__ = [
    "GitlabRegistry",
    "UploadToGitlabOptions",
    "DownloadFromGitlabOptions",
    "DeleteFromGitlabOptions",
    "upload_main",
    "download_main",
    "delete_main",
]

CHECK_SETTINGS = "gitlab_url / gitlab_project_id (env.yaml, GITLAB_URL / GITLAB_PROJECT_ID)"
CHECK_TOKEN = "gitlab_token (env.yaml, GITLAB_TOKEN or ng_login +service=gitlab; it needs the api scope)"


class UploadToGitlabOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)
    dataset_name: str = Field(description="dataset (generic package) name, case sensitive")
    version: str = Field(description="dataset version, x.y.z (e.g. 0.0.1)")
    input_jsonl_fpath: str = Field(description="JSONL file to upload; its file name is kept in the registry")
    overwrite: bool = Field(False, description="replace the version if it already exists")


class DownloadFromGitlabOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)
    dataset_name: str = Field(description="dataset (generic package) name, case sensitive")
    version: str = Field(description="dataset version, x.y.z")
    artifact_fpath: str | None = Field(None, description="file of the version to fetch (default: its only JSONL file)")
    output_fpath: str = Field(description="where to write the file")
    overwrite: bool = Field(False, description="replace output_fpath if it exists")


class DeleteFromGitlabOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)
    dataset_name: str = Field(description="dataset (generic package) name whose versions are all deleted")
    yes: bool = Field(False, description="do not ask for confirmation")


class GitlabRegistry:
    """One GitLab project's generic package registry, reached with python-gitlab.

    Raises (every method):
        RegistryError: missing settings, an unreachable host, a refused token, a missing dataset or version.
    """

    def __init__(self, url: str | None = None, token: str | None = None, project_id: str | int | None = None):
        self.url = setting("gitlab_url", ("GITLAB_URL",), url, login=("gitlab", "url"))
        self.token = token_for("gitlab", token)
        self.project_id = setting("gitlab_project_id", ("GITLAB_PROJECT_ID",), project_id)
        missing = [
            name
            for name, value in (
                ("gitlab_url", self.url),
                ("gitlab_project_id", self.project_id),
                ("gitlab_token", self.token),
            )
            if not value
        ]
        if missing:
            raise RegistryError(
                f"GitLab settings missing: {', '.join(missing)}; set them in env.yaml, as GITLAB_URL /"
                " GITLAB_PROJECT_ID / GITLAB_TOKEN, or with ng_login +service=gitlab"
            )
        self.host = host_of(str(self.url))
        self.client = gitlab.Gitlab(url=str(self.url), private_token=self.token, timeout=60)
        self.project = self.client.projects.get(self.project_id, lazy=True)

    @property
    def where(self) -> str:
        return f"GitLab at {self.host} (project {self.project_id})"

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        try:
            yield
        except requests.RequestException as exc:  # refused, timed out, or the connection broke mid-transfer
            raise RegistryError(
                f"cannot reach {self.where} while {action}: {self._clean(exc)}. Check {CHECK_SETTINGS} and the network"
                " connection"
            ) from None
        except gitlab.GitlabError as exc:
            code = getattr(exc, "response_code", None)
            if code in (401, 403):
                raise RegistryError(
                    f"{self.where} refused the token (HTTP {code}) while {action}; check {CHECK_TOKEN}"
                ) from None
            if code == 404:
                raise RegistryError(
                    f"{self.where}: not found (HTTP 404) while {action}; check gitlab_project_id and the dataset name"
                    " and version"
                ) from None
            raise RegistryError(f"{self.where} failed while {action}: HTTP {code}: {self._clean(exc)}") from None

    def _clean(self, exc: BaseException) -> str:
        return redact(str(exc), [self.token])

    def packages(self, dataset_name: str) -> list[Any]:
        """The generic packages named exactly `dataset_name` (one per version), oldest first.

        Raises:
            PathEscapeError: `dataset_name` is not one plain name (it becomes part of the registry's URL paths).
        """
        check_name(dataset_name, what="dataset_name")
        with self._errors(f"listing the versions of {dataset_name!r}"):
            found = self.project.packages.list(package_name=dataset_name, package_type="generic", get_all=True)
        return sorted((p for p in found if p.name == dataset_name), key=lambda p: p.id)

    def _package(self, dataset_name: str, version: str) -> Any | None:
        return next((p for p in self.packages(dataset_name) if p.version == version), None)

    def upload(self, dataset_name: str, version: str, path: Path, *, overwrite: bool = False) -> str:
        """Upload `path` as `dataset_name` `version` (with its `.sha256` file). Returns the sha256.

        Raises:
            RegistryError: the version exists and not `overwrite`; the server's sha256 differs from the file's.
        """
        check_version(version)
        if not path.is_file():
            raise RegistryError(f"{path}: no such file to upload")
        existing = self._package(dataset_name, version)
        if existing is not None:
            if not overwrite:
                raise RegistryError(
                    f"dataset {dataset_name!r} version {version} already exists in {self.where}; pass +overwrite=true"
                    " to replace it, or choose another version"
                )
            with self._errors(f"deleting {dataset_name!r} {version} to overwrite it"):
                self.project.packages.delete(existing.id)
        digest = sha256_file(path)
        with self._errors(f"uploading {path.name} as {dataset_name!r} {version}"):
            with path.open("rb") as fh:
                stored = self.project.generic_packages.upload(
                    dataset_name, version, path.name, data=fh, select="package_file"
                )
            self.project.generic_packages.upload(
                dataset_name, version, f"{path.name}.sha256", data=f"{digest}  {path.name}\n".encode()
            )
        remote = getattr(stored, "file_sha256", None)
        if remote and remote != digest:
            raise RegistryError(
                f"{self.where} stored {path.name} with sha256 {remote}, but the file has {digest}: the upload was"
                " corrupted; upload again with +overwrite=true"
            )
        return digest

    def _files(self, package: Any) -> list[Any]:
        with self._errors(f"listing the files of {package.name!r} {package.version}"):
            return sorted(
                self.project.packages.get(package.id, lazy=True).package_files.list(get_all=True), key=lambda f: f.id
            )

    def resolve_file(self, dataset_name: str, version: str, artifact_fpath: str | None = None) -> tuple[str, str]:
        """The file of a version to download (`artifact_fpath`, else its only data file) and its sha256.

        Raises:
            RegistryError: no such version or file, several files and no `artifact_fpath`, no sha256 known.
        """
        package = self._package(dataset_name, version)
        if package is None:
            versions = ", ".join(p.version for p in self.packages(dataset_name)) or "none"
            raise RegistryError(
                f"dataset {dataset_name!r} has no version {version} in {self.where} (versions: {versions})"
            )
        files = self._files(package)
        names = sorted({f.file_name for f in files if not f.file_name.endswith(".sha256")})
        if artifact_fpath is None and len(names) != 1:
            raise RegistryError(
                f"dataset {dataset_name!r} {version} has files {names}; choose one with +artifact_fpath=..."
            )
        name = artifact_fpath or names[0]
        matching = [f for f in files if f.file_name == name]
        if not matching:
            raise RegistryError(
                f"dataset {dataset_name!r} {version} in {self.where} has no file {name!r} (files: {names})"
            )
        return name, getattr(matching[-1], "file_sha256", None) or self._sidecar_sha256(
            dataset_name, version, name, files
        )

    def download(
        self,
        dataset_name: str,
        version: str,
        output: Path,
        artifact_fpath: str | None = None,
        *,
        overwrite: bool = False,
    ) -> Path:
        """Download a version's file to `output` (checked against its sha256, moved into place atomically).

        Raises:
            RegistryError: no such version or file; `output` exists and not `overwrite`; a checksum mismatch.
        """
        check_output_free(output, overwrite)
        name, expected = self.resolve_file(dataset_name, version, artifact_fpath)

        def fetch(tmp_dir: Path) -> Path:
            target = resolve_inside(
                tmp_dir, Path(name).name, what=f"file name {name!r} from {self.where}"
            )  # the registry's name: no '..'
            with target.open("wb") as fh, self._errors(f"downloading {name} of {dataset_name!r} {version}"):
                self.project.generic_packages.download(
                    dataset_name, version, name, streamed=True, action=fh.write, chunk_size=1 << 20
                )
            return target

        def verify(path: Path) -> None:
            actual = sha256_file(path)
            if actual != expected:
                raise RegistryError(
                    f"checksum mismatch for {name} of {dataset_name!r} {version} from {self.where}: expected sha256"
                    f" {expected}, got {actual}; nothing was written to {output}"
                )

        return atomic_download(output, fetch, verify)

    def _sidecar_sha256(self, dataset_name: str, version: str, name: str, files: list[Any]) -> str:
        if not any(f.file_name == f"{name}.sha256" for f in files):
            raise RegistryError(
                f"{self.where} reports no sha256 for {name} of {dataset_name!r} {version} and it has no {name}.sha256"
                " file; cannot verify the download"
            )
        with self._errors(f"downloading {name}.sha256"):
            text = self.project.generic_packages.download(dataset_name, version, f"{name}.sha256")
        return bytes(text).decode().split()[0]

    def delete(self, dataset_name: str) -> list[str]:
        """Delete every version of `dataset_name`. Returns the versions deleted."""
        deleted = []
        for package in self.packages(dataset_name):
            with self._errors(f"deleting {dataset_name!r} {package.version}"):
                self.project.packages.delete(package.id)
            deleted.append(package.version)
        return deleted

    def latest_version(self, dataset_name: str) -> str:
        """The highest `x.y.z` version of `dataset_name`.

        Raises:
            RegistryError: the dataset has no version.
        """
        versions = [p.version for p in self.packages(dataset_name)]
        if not versions:
            raise RegistryError(f"dataset {dataset_name!r} not found in {self.where}")
        return max(versions, key=lambda v: tuple(int(x) if x.isdigit() else -1 for x in v.split(".")))


def upload_main(options: UploadToGitlabOptions) -> int:
    registry = GitlabRegistry()
    path = Path(options.input_jsonl_fpath)
    digest = registry.upload(options.dataset_name, options.version, path, overwrite=options.overwrite)
    print(
        f"uploaded {path.name} as dataset {options.dataset_name!r} version {options.version} to {registry.where}"
        f" (sha256 {digest})"
    )
    return 0


def download_main(options: DownloadFromGitlabOptions) -> int:
    registry = GitlabRegistry()
    output = registry.download(
        options.dataset_name,
        options.version,
        Path(options.output_fpath),
        options.artifact_fpath,
        overwrite=options.overwrite,
    )
    print(
        f"downloaded dataset {options.dataset_name!r} version {options.version} from {registry.where} to {output}"
        " (sha256 verified)"
    )
    return 0


def delete_dataset(registry: GitlabRegistry, dataset_name: str, yes: bool) -> list[str]:
    """Delete every version of a dataset after a confirmation (`yes` skips it). Returns the versions deleted.

    Raises:
        RegistryError: the dataset does not exist, or there is no terminal to confirm on and not `yes`.
    """
    versions = [p.version for p in registry.packages(dataset_name)]
    if not versions:
        raise RegistryError(f"dataset {dataset_name!r} not found in {registry.where}")
    if not confirm(f"Delete dataset {dataset_name!r} (versions {', '.join(versions)}) from {registry.where}?", yes):
        print("not deleted")
        return []
    return registry.delete(dataset_name)


def delete_main(options: DeleteFromGitlabOptions) -> int:
    registry = GitlabRegistry()
    deleted = delete_dataset(registry, options.dataset_name, options.yes)
    if deleted:
        print(f"deleted dataset {options.dataset_name!r} (versions {', '.join(deleted)}) from {registry.where}")
    return 0


def download_to_dir(
    registry: GitlabRegistry, dataset_name: str, version: str | None, artifact_fpath: str | None, directory: Path
) -> Path:
    """Download a version (default: the latest) into `directory`, keeping the registry's file name."""
    version = version or registry.latest_version(dataset_name)
    name, _ = registry.resolve_file(dataset_name, version, artifact_fpath)
    target = resolve_inside(directory, Path(name).name, what=f"file name {name!r} from {registry.where}")
    return registry.download(dataset_name, version, target, name)
