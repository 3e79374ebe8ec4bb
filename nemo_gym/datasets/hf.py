"""Datasets on the Hugging Face Hub, through `huggingface_hub`.

Upload: a private dataset repository `{hf_organization}/{hf_dataset_prefix}-{Domain}-{resources server}-{dataset_name}`
(the domain and resources server come from `resource_config_path`), added to the collection
`{hf_organization}/{hf_collection_name}-{hf_collection_slug}` (or one titled `hf_collection_name`, created when
no slug is given), holding the JSONL under its file name. Download: `hf_hub_download` into a temporary folder
next to the output, checked against the Hub's checksum of the file (the LFS sha256, or the git blob id of a
small file), then moved into place.

Settings: `hf_token` (parameter, env.yaml, `HF_TOKEN` or `ng_login +service=hf`), `hf_organization`,
`hf_collection_name`, `hf_collection_slug` (parameter or env.yaml), `hf_endpoint` (env.yaml or `HF_ENDPOINT`,
default https://huggingface.co).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
import yaml
from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import (
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
)
from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.common.layout import SERVER_TYPES
from nemo_gym.common.paths import resolve_inside
from nemo_gym.datasets.common import (
    RegistryError,
    atomic_download,
    check_output_free,
    confirm,
    git_blob_sha1,
    host_of,
    redact,
    setting,
    sha256_file,
    token_for,
)
from nemo_gym.datasets.gitlab import GitlabRegistry, download_to_dir

__all__ = [
    "HubDatasets",
    "UploadToHfOptions",
    "DownloadFromHfOptions",
    "GitlabToHfOptions",
    "hf_repo_id",
    "upload_main",
    "download_main",
    "gitlab_to_hf_main",
]

DEFAULT_ENDPOINT = "https://huggingface.co"
CHECK_TOKEN = "hf_token (parameter, env.yaml, HF_TOKEN or ng_login +service=hf)"


class _HfTarget(BaseModel):
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)
    hf_token: str | None = Field(
        None, description="Hub token with write access (default: env.yaml hf_token, HF_TOKEN, ng_login)"
    )
    hf_organization: str | None = Field(
        None, description="organization (or user) owning the repository (default: env.yaml)"
    )
    hf_collection_name: str | None = Field(
        None, description="collection to add the dataset to (default: env.yaml; none: no collection)"
    )
    hf_collection_slug: str | None = Field(
        None,
        description="id at the end of the collection's URL (default: env.yaml; none: create the collection by name)",
    )
    dataset_name: str = Field(description="your dataset name (last part of the repository name)")
    resource_config_path: str = Field(
        description="resources server config whose domain and server name go into the repository name"
    )
    hf_dataset_prefix: str = Field("NeMo-Gym", description="first part of the repository name")
    overwrite: bool = Field(False, description="replace the file if the repository already has it")
    yes: bool = Field(
        False, description="delete from GitLab without asking for confirmation (needed without a terminal)"
    )


class UploadToHfOptions(_HfTarget):
    input_jsonl_fpath: str = Field(description="JSONL file to upload; its file name is kept in the repository")
    delete_from_gitlab: bool = Field(
        False, description="after the upload, delete the dataset (all versions) from GitLab"
    )


class GitlabToHfOptions(_HfTarget):
    input_jsonl_fpath: str | None = Field(
        None, description="JSONL file to upload (default: download it from GitLab first)"
    )
    version: str | None = Field(None, description="GitLab version to migrate when downloading (default: the latest)")


class DownloadFromHfOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)
    repo_id: str = Field(description="dataset repository, <organization>/<name>")
    artifact_fpath: str = Field(description="file of the repository to download (e.g. train.jsonl)")
    output_fpath: str = Field(description="where to write the file")
    hf_token: str | None = Field(
        None, description="Hub token (default: env.yaml hf_token, HF_TOKEN, ng_login); needed for private repositories"
    )
    overwrite: bool = Field(False, description="replace output_fpath if it exists")


def resources_server_of(config_path: Path) -> tuple[str, str]:
    """`(domain, resources server folder name)` of the first resources server in a config YAML.

    Raises:
        RegistryError: no such file, no resources server, or no `domain:` field.
    """
    if not config_path.is_file():
        raise RegistryError(f"{config_path}: resource_config_path does not exist")
    data = yaml.safe_load(config_path.read_text()) or {}
    for value in data.values() if isinstance(data, dict) else []:
        if isinstance(value, dict) and isinstance(value.get(SERVER_TYPES[0]), dict):
            for name, fields in value[SERVER_TYPES[0]].items():
                domain = (fields or {}).get("domain")
                if not domain:
                    raise RegistryError(
                        f"{config_path}: resources server {name!r} has no `domain:`; add one (e.g. domain: math)"
                    )
                return str(domain), str(name)
    raise RegistryError(f"{config_path}: no resources server instance (`<name>: resources_servers: <folder>: ...`)")


def hf_repo_id(organization: str, prefix: str, domain: str, server_name: str, dataset_name: str) -> str:
    """`{organization}/{prefix}-{Domain}-{server_name}-{dataset_name}` (NeMo Gym's naming)."""
    return f"{organization}/{prefix}-{domain.title()}-{server_name}-{dataset_name}"


class HubDatasets:
    """Dataset repositories on a Hub (`hf_endpoint`), with one token.

    Raises (every method):
        RegistryError: an unreachable Hub, a refused token, a missing repository or file, a checksum mismatch.
    """

    def __init__(self, token: str | None = None, endpoint: str | None = None):
        self.token = token_for("hf", token)
        self.endpoint = str(setting("hf_endpoint", ("HF_ENDPOINT",), endpoint) or DEFAULT_ENDPOINT).rstrip("/")
        self.host = host_of(self.endpoint)
        self.api = HfApi(endpoint=self.endpoint, token=self.token or False)

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        where = f"the Hugging Face Hub at {self.host}"
        try:
            yield
        except RepositoryNotFoundError:
            raise RegistryError(
                f"{where}: repository not found while {action}, or the token cannot see it (private); check the repo_id"
                f" and {CHECK_TOKEN}"
            ) from None
        except RemoteEntryNotFoundError:
            raise RegistryError(f"{where}: file not found while {action}; check artifact_fpath") from None
        except HfHubHTTPError as exc:
            code = exc.response.status_code if exc.response is not None else None
            if code in (401, 403):
                raise RegistryError(
                    f"{where} refused the token (HTTP {code}) while {action}; check {CHECK_TOKEN} and its write access"
                ) from None
            raise RegistryError(
                f"{where} failed while {action}: HTTP {code}: {redact(str(exc), [self.token])}"
            ) from None
        except (httpx2.TransportError, LocalEntryNotFoundError) as exc:  # refused, timed out, broken mid-transfer
            raise RegistryError(
                f"cannot reach {where} while {action}: {redact(str(exc), [self.token])}. Check HF_ENDPOINT (or"
                " hf_endpoint in env.yaml) and the network connection"
            ) from None

    def file_info(self, repo_id: str, path: str) -> Any | None:
        """The Hub's RepoFile of `path` (size, blob id, LFS sha256), or None when the repository lacks it."""
        with self._errors(f"looking up {path} in {repo_id}"):
            found = self.api.get_paths_info(repo_id, [path], repo_type="dataset")
        return next((f for f in found if getattr(f, "blob_id", None) and f.path == path), None)

    def upload(
        self,
        repo_id: str,
        path: Path,
        *,
        collection_slug: str | None = None,
        collection_title: str | None = None,
        overwrite: bool = False,
    ) -> str:
        """Create the private dataset repository (if needed), add it to the collection, upload `path` under its name.

        Returns the repository URL.

        Raises:
            RegistryError: the repository already has the file and not `overwrite`; the Hub's checksum differs.
        """
        if not path.is_file():
            raise RegistryError(f"{path}: no such file to upload")
        with self._errors(f"creating {repo_id}"):
            url = str(self.api.create_repo(repo_id, private=True, repo_type="dataset", exist_ok=True))
        if self.file_info(repo_id, path.name) is not None and not overwrite:
            raise RegistryError(f"{repo_id} at {self.host} already has {path.name}; pass +overwrite=true to replace it")
        self._add_to_collection(repo_id, collection_slug, collection_title)
        with self._errors(f"uploading {path.name} to {repo_id}"):
            self.api.upload_file(
                path_or_fileobj=str(path),
                path_in_repo=path.name,
                repo_id=repo_id,
                repo_type="dataset",
                commit_message=f"Upload {path.name}",
            )
        info = self.file_info(repo_id, path.name)
        if info is None:
            raise RegistryError(f"{repo_id} at {self.host} does not list {path.name} after the upload; upload again")
        _verify(path, info, f"{path.name} uploaded to {repo_id}")
        return url

    def _add_to_collection(self, repo_id: str, slug: str | None, title: str | None) -> None:
        if not (slug or title):
            return
        with self._errors(f"adding {repo_id} to its collection"):
            if not slug:
                slug = self.api.create_collection(
                    title=str(title), namespace=repo_id.split("/")[0], private=True, exists_ok=True
                ).slug
            self.api.add_collection_item(slug, item_id=repo_id, item_type="dataset", exists_ok=True)

    def download(self, repo_id: str, artifact_fpath: str, output: Path, *, overwrite: bool = False) -> Path:
        """Download `artifact_fpath` of a dataset repository to `output`, verified against the Hub's checksum.

        Raises:
            RegistryError: `output` exists and not `overwrite`; no such repository or file; a checksum mismatch.
        """
        check_output_free(output, overwrite)
        info = self.file_info(repo_id, artifact_fpath)
        if info is None:
            raise RegistryError(f"{repo_id} at {self.host} has no file {artifact_fpath!r}; check artifact_fpath")

        def fetch(tmp_dir: Path) -> Path:
            resolve_inside(
                tmp_dir, artifact_fpath, what="artifact_fpath"
            )  # the file lands at tmp_dir/artifact_fpath: no '..'
            with self._errors(f"downloading {artifact_fpath} of {repo_id}"):
                return Path(
                    hf_hub_download(
                        repo_id,
                        artifact_fpath,
                        repo_type="dataset",
                        local_dir=tmp_dir,
                        token=self.token or False,
                        endpoint=self.endpoint,
                    )
                )

        return atomic_download(
            output, fetch, lambda path: _verify(path, info, f"{artifact_fpath} of {repo_id} from {self.host}", output)
        )


def _verify(path: Path, info: Any, what: str, output: Path | None = None) -> None:
    """Compare a local file with the Hub's checksum: the LFS sha256 if any, else the git blob id."""
    lfs = getattr(info, "lfs", None)
    expected, actual, kind = (
        (lfs.sha256, sha256_file(path), "sha256") if lfs else (info.blob_id, git_blob_sha1(path), "git blob sha1")
    )
    if actual != expected:
        written = f"; nothing was written to {output}" if output else ""
        raise RegistryError(f"checksum mismatch for {what}: expected {kind} {expected}, got {actual}{written}")


def _collection(options: _HfTarget, organization: str) -> tuple[str | None, str | None]:
    name = setting("hf_collection_name", (), options.hf_collection_name)
    slug = setting("hf_collection_slug", (), options.hf_collection_slug)
    if slug and "/" not in str(slug):
        slug = f"{organization}/{name}-{slug}" if name else None
    return (str(slug) if slug else None), (str(name) if name else None)


def _upload(options: _HfTarget, path: Path) -> str:
    organization = setting("hf_organization", (), options.hf_organization)
    if not organization:
        raise RegistryError("hf_organization is not set; pass +hf_organization=... or set it in env.yaml")
    domain, server = resources_server_of(Path(options.resource_config_path))
    repo_id = hf_repo_id(str(organization), options.hf_dataset_prefix, domain, server, options.dataset_name)
    slug, title = _collection(options, str(organization))
    hub = HubDatasets(options.hf_token)
    url = hub.upload(repo_id, path, collection_slug=slug, collection_title=title, overwrite=options.overwrite)
    print(
        f"uploaded {path.name} to {repo_id} ({url}); download it with: ng_download_dataset_from_hf +repo_id={repo_id}"
        f" +artifact_fpath={path.name} +output_fpath=..."
    )
    return repo_id


def _confirm_move(registry: GitlabRegistry, dataset_name: str, yes: bool) -> bool:
    """Ask before anything is uploaded whether the dataset may be deleted from GitLab afterwards.

    Raises:
        RegistryError: the dataset is not in GitLab, or there is no terminal to ask on and not `yes`.
    """
    versions = [p.version for p in registry.packages(dataset_name)]
    if not versions:
        raise RegistryError(f"dataset {dataset_name!r} not found in {registry.where}")
    return confirm(
        f"Upload {dataset_name!r} to the Hub, then delete it (versions {', '.join(versions)}) from {registry.where}?",
        yes,
    )


def _delete_from_gitlab(registry: GitlabRegistry, dataset_name: str) -> None:
    deleted = registry.delete(dataset_name)
    print(f"deleted dataset {dataset_name!r} (versions {', '.join(deleted)}) from {registry.where}")


def upload_main(options: UploadToHfOptions) -> int:
    registry = GitlabRegistry() if options.delete_from_gitlab else None
    if registry is not None and not _confirm_move(registry, options.dataset_name, options.yes):
        print("nothing uploaded or deleted")
        return 1
    _upload(options, Path(options.input_jsonl_fpath))
    if registry is not None:
        _delete_from_gitlab(registry, options.dataset_name)
    return 0


def gitlab_to_hf_main(options: GitlabToHfOptions) -> int:
    registry = GitlabRegistry()
    if not _confirm_move(registry, options.dataset_name, options.yes):
        print("nothing uploaded or deleted")
        return 1
    with tempfile.TemporaryDirectory(prefix="ng_gitlab_to_hf_") as tmp:
        path = (
            Path(options.input_jsonl_fpath)
            if options.input_jsonl_fpath
            else download_to_dir(registry, options.dataset_name, options.version, None, Path(tmp))
        )
        _upload(options, path)
    _delete_from_gitlab(registry, options.dataset_name)
    return 0


def download_main(options: DownloadFromHfOptions) -> int:
    hub = HubDatasets(options.hf_token)
    output = hub.download(
        options.repo_id, options.artifact_fpath, Path(options.output_fpath), overwrite=options.overwrite
    )
    print(f"downloaded {options.artifact_fpath} of {options.repo_id} from {hub.host} to {output} (checksum verified)")
    return 0
