"""Pushing an export folder to a Hub dataset repo as one tagged version.

Steps: create the repo if needed; if the version's tag exists, compare its files with the
folder (same: nothing to do; different: refuse, a version is immutable); else commit the folder
to ``main`` (dropping data files of configs the folder no longer has) and tag that commit
``v<version>``. Old tags keep pointing at their commits, so every version stays loadable by
revision. A push interrupted after the commit but before the tag finds nothing changed on the
retry (the client skips unchanged files) and only tags.

The token is huggingface_hub's own (HF_TOKEN, else the ``hf auth login`` file); it is never
read into a message. Every failure becomes one ``PublishError`` line with the fix.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from opsynth.publish.errors import PublishError
from opsynth.publish.layout import (
    CONFIG_FOLDERS,
    MANIFEST_PATH,
    RECHECK_CONFIG_PATH,
    RECHECK_MANIFEST_PATH,
)

DELETE_PATTERNS = [f"{folder}/*" for folder in CONFIG_FOLDERS] + [
    MANIFEST_PATH,
    RECHECK_MANIFEST_PATH,
    RECHECK_CONFIG_PATH,
]
REPO_TYPE = "dataset"
HUB_FILES_IGNORED = {".gitattributes"}  # the Hub adds it to every new repo
T = TypeVar("T")
# the HTTP client huggingface_hub speaks: httpx2 from 2.x, httpx before
HTTP_CLIENTS = ("httpx2", "httpx")


@dataclass(frozen=True)
class Pushed:
    repo_id: str
    tag: str
    commit: str
    changed: bool  # False: the version was already there with the same files
    url: str


def tag_of(version: str) -> str:
    return f"v{version}"


def check_repo_id(repo_id: str) -> None:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise PublishError(f"--repo-id {repo_id!r} is not a valid ORG/NAME ({exc})") from exc
    if repo_id.count("/") != 1:
        raise PublishError(f"--repo-id {repo_id!r} must be ORG/NAME (a namespace and a name)")


def local_oids(root: Path) -> dict[str, tuple[str, str]]:
    """Each file's (sha256, git blob sha1): the Hub names LFS files by the first, regular
    files by the second."""
    found = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        blob = path.read_bytes()
        git = hashlib.sha1(b"blob %d\0" % len(blob) + blob).hexdigest()
        found[path.relative_to(root).as_posix()] = (hashlib.sha256(blob).hexdigest(), git)
    return found


def same_files(api, repo_id: str, revision: str, root: Path) -> bool:
    """Whether ``revision`` holds exactly the files of ``root``, byte for byte."""
    from huggingface_hub.hf_api import RepoFile

    local = local_oids(root)
    remote = {}
    tree = api.list_repo_tree(repo_id, repo_type=REPO_TYPE, revision=revision, recursive=True)
    for entry in tree:
        if isinstance(entry, RepoFile) and entry.path not in HUB_FILES_IGNORED:
            remote[entry.path] = entry.lfs.sha256 if entry.lfs else entry.blob_id
    if set(remote) != set(local):
        return False
    return all(remote[p] in local[p] for p in local)


def push(root: Path, repo_id: str, version: str, private: bool, message: str) -> Pushed:
    """Publish the export folder ``root`` as ``version`` of ``repo_id``."""
    from huggingface_hub import HfApi, get_token

    check_repo_id(repo_id)
    if get_token() is None:
        raise PublishError(
            "no Hugging Face token: set HF_TOKEN or run `hf auth login`, then re-run "
            f"(the export in {root} is kept)"
        )
    api = HfApi()
    tag = tag_of(version)

    def hub(step: str, call: Callable[[], T]) -> T:
        return _translate(step, call, repo_id, root, api.endpoint)

    hub(
        "create the repo",
        lambda: api.create_repo(repo_id, repo_type=REPO_TYPE, private=private, exist_ok=True),
    )
    refs = hub("list its refs", lambda: api.list_repo_refs(repo_id, repo_type=REPO_TYPE))
    tags = {ref.name: ref.target_commit for ref in refs.tags}
    url = f"{api.endpoint}/datasets/{repo_id}/tree/{tag}"
    if tag in tags:
        if hub("compare", lambda: same_files(api, repo_id, tag, root)):
            return Pushed(repo_id, tag, tags[tag], False, url)
        major, minor, patch = (int(x) for x in version.split("."))
        raise PublishError(
            f"{repo_id} already has {tag} with other content; a version never changes, so "
            f"publish this run as a new one (e.g. --version {major}.{minor}.{patch + 1})"
        )
    commit = hub(
        "commit",
        lambda: api.upload_folder(
            repo_id=repo_id,
            folder_path=root,
            repo_type=REPO_TYPE,
            commit_message=message,
            delete_patterns=DELETE_PATTERNS,
        ),
    )
    hub(
        "tag",
        lambda: api.create_tag(
            repo_id, tag=tag, revision=commit.oid, repo_type=REPO_TYPE, tag_message=message
        ),
    )
    return Pushed(repo_id, tag, commit.oid, True, url)


def transport_errors() -> tuple[type[BaseException], ...]:
    """What the Hub client raises when no answer comes (refused, reset, timed out)."""
    found: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for name in HTTP_CLIENTS:
        try:
            found.append(importlib.import_module(name).TransportError)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def _translate(step: str, call: Callable[[], T], repo_id: str, root: Path, endpoint: str) -> T:
    """Run one Hub call; turn what can go wrong into one line naming the fix."""
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled, RepositoryNotFoundError

    kept = f"the export in {root} is kept; re-run to retry"
    try:
        return call()
    except OfflineModeIsEnabled as exc:
        raise PublishError(f"HF_HUB_OFFLINE is set; unset it to publish ({kept})") from exc
    except RepositoryNotFoundError as exc:
        raise PublishError(
            f"{repo_id} was not found on {endpoint} ({step}); check --repo-id and that your "
            "token can see it"
        ) from exc
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status == 401:
            raise PublishError(
                f"{endpoint} refused the token (401); run `hf auth login` or set HF_TOKEN to a "
                "token with write access"
            ) from exc
        if status == 403:
            raise PublishError(
                f"the token may not write to {repo_id.split('/')[0]} (403); use a namespace you "
                "own or a token with write access to it"
            ) from exc
        server = (exc.server_message or "").splitlines()[0:1]
        said = f": {server[0]}" if server else ""
        raise PublishError(f"{endpoint} failed to {step} (HTTP {status}{said}); {kept}") from exc
    except transport_errors() as exc:
        raise PublishError(
            f"cannot reach {endpoint} to {step} ({type(exc).__name__}); check the network "
            f"(or HF_ENDPOINT), then re-run: {kept}"
        ) from exc
