"""A small Hugging Face Hub-compatible HTTP server on loopback, for tests.

It implements just the endpoints that the real ``huggingface_hub`` and ``datasets`` clients use
to create a dataset repo, commit to it (preupload, LFS batch + upload, commit), tag it, list its
refs and read it back (repo info, tree, paths-info, resolve), so publishing is tested with the
unmodified clients and no network. Repos keep every commit, so old tags stay readable. State is
in memory; one server per test module. Only dataset repos exist here.

Not implemented (the clients under test do not need them): Xet storage (set
``HF_HUB_DISABLE_XET=1``), pull requests, multipart LFS uploads, copies.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

GITATTRIBUTES = b"*.parquet filter=lfs diff=lfs merge=lfs -text\n"
LFS_SUFFIXES = (".parquet", ".arrow", ".png", ".bin")
LFS_POINTER_SIZE = 134  # what the Hub reports as the size of a git-lfs pointer file


def git_blob_oid(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@dataclass(frozen=True)
class Entry:
    """A file in a commit: regular content, or an LFS object's sha256."""

    size: int
    content: bytes | None = None
    lfs_oid: str | None = None

    @property
    def oid(self) -> str:
        if self.lfs_oid is not None:
            return git_blob_oid(f"lfs {self.lfs_oid} {self.size}".encode())
        return git_blob_oid(self.content or b"")

    def info(self, path: str) -> dict[str, Any]:
        row: dict[str, Any] = {"type": "file", "oid": self.oid, "size": self.size, "path": path}
        if self.lfs_oid is not None:
            row["lfs"] = {"oid": self.lfs_oid, "size": self.size, "pointerSize": LFS_POINTER_SIZE}
        return row


@dataclass
class Commit:
    oid: str
    title: str
    files: dict[str, Entry]
    date: str = field(
        default_factory=lambda: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    )


@dataclass
class Repo:
    repo_id: str
    private: bool
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)

    def resolve(self, revision: str) -> Commit | None:
        oid = self.branches.get(revision) or self.tags.get(revision)
        if oid is None and revision in self.commits:
            oid = revision
        return self.commits.get(oid) if oid else None

    def commit(self, branch: str, title: str, files: dict[str, Entry]) -> Commit:
        parent = self.branches.get(branch, "")
        oid = hashlib.sha1(f"{parent}\n{title}\n{len(self.commits)}".encode()).hexdigest()
        new = Commit(oid, title, files)
        self.commits[oid] = new
        self.branches[branch] = oid
        return new


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


class HubState:
    """Repos, LFS objects, accepted tokens and writable namespaces; ``fail_commits`` makes the
    commit endpoint answer 500, to test a push that fails half way."""

    def __init__(self, tokens: dict[str, list[str]]) -> None:
        self.tokens = tokens  # token -> namespaces it may write to
        self.repos: dict[str, Repo] = {}
        self.lfs: dict[str, bytes] = {}
        self.fail_commits = False
        self.lock = threading.Lock()
        self.requests: list[str] = []


class Handler(BaseHTTPRequestHandler):
    server: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet test output
        return None

    # plumbing -------------------------------------------------------------------------------
    @property
    def state(self) -> HubState:
        return self.server.state

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, payload: Any, status: int = 200, headers: dict[str, str] | None = None):
        head = {"Content-Type": "application/json", **(headers or {})}
        self._send(status, json.dumps(payload).encode(), head)

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        return auth[7:] if auth.startswith("Bearer ") else None

    def _require_write(self, namespace: str) -> None:
        token = self._token()
        if token is None or token not in self.state.tokens:
            raise HubError(401, "Invalid username or password.")
        if namespace not in self.state.tokens[token]:
            raise HubError(403, f'You don\'t have the rights to write under "{namespace}"')

    def _repo(self, repo_id: str) -> Repo:
        repo = self.state.repos.get(repo_id)
        if repo is None or (repo.private and self._token() not in self.state.tokens):
            raise HubError(404, "Repository not found", "RepoNotFound")
        return repo

    def _commit(self, repo: Repo, revision: str) -> Commit:
        found = repo.resolve(revision)
        if found is None:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return found

    def _dispatch(self) -> None:
        url = urlsplit(self.path)
        self.state.requests.append(f"{self.command} {url.path}")
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        parts = url.path.strip("/").split("/")
        try:
            token = self._token()
            if token is not None and token not in self.state.tokens:  # as the Hub: any request
                raise HubError(401, "Invalid credentials in Authorization header")
            with self.state.lock:
                self._route(parts, query)
        except HubError as exc:
            headers = {"X-Error-Message": exc.message}
            if exc.code:
                headers["X-Error-Code"] = exc.code
            self._json({"error": exc.message}, exc.status, headers)

    do_GET = do_POST = do_PUT = do_HEAD = _dispatch  # noqa: N815

    def _route(self, parts: list[str], query: dict[str, str]) -> None:
        method = self.command
        if parts[:3] == ["api", "repos", "create"] and method == "POST":
            return self._create_repo(json.loads(self._body()))
        if parts[:2] == ["api", "validate-yaml"]:
            return self._validate_yaml(json.loads(self._body()))
        if parts[0] == "lfs-upload" and method == "PUT":
            return self._lfs_put(parts[1])
        if parts[:2] == ["api", "datasets"] and len(parts) >= 4:
            repo_id = f"{parts[2]}/{parts[3]}"
            action, rest = (parts[4], parts[5:]) if len(parts) > 4 else ("info", [])
            return self._api(repo_id, action, rest, query)
        if parts[0] == "datasets" and len(parts) >= 3 and parts[2].endswith(".git"):
            return self._lfs_batch(f"{parts[1]}/{parts[2][:-4]}", json.loads(self._body()))
        if parts[0] == "datasets" and len(parts) >= 6 and parts[3] == "resolve":
            repo = self._repo(f"{parts[1]}/{parts[2]}")
            return self._resolve(repo, unquote(parts[4]), unquote("/".join(parts[5:])))
        raise HubError(404, f"no route for {method} {self.path}")

    # repos ----------------------------------------------------------------------------------
    def _create_repo(self, body: dict[str, Any]) -> None:
        namespace = body.get("organization") or "user"
        self._require_write(namespace)
        if body.get("type") != "dataset":
            raise HubError(400, "this test hub only holds dataset repos")
        repo_id = f"{namespace}/{body['name']}"
        url = f"{self.server.url}/datasets/{repo_id}"
        if repo_id in self.state.repos:
            return self._json({"error": "You already created this dataset repo", "url": url}, 409)
        private = body.get("visibility") == "private" or bool(body.get("private"))
        repo = Repo(repo_id, private=private)
        entry = Entry(len(GITATTRIBUTES), content=GITATTRIBUTES)
        repo.commit("main", "initial commit", {".gitattributes": entry})
        self.state.repos[repo_id] = repo
        self._json({"url": url, "name": repo_id})

    def _validate_yaml(self, body: dict[str, Any]) -> None:
        match = re.match(r"^---\n(.*?)\n---\n", body.get("content", ""), re.S)
        if match and not isinstance(yaml.safe_load(match.group(1)), dict):
            return self._json({"errors": [{"message": "metadata is not a mapping"}]}, 400)
        self._json({"errors": [], "warnings": []})

    def _api(self, repo_id: str, action: str, rest: list[str], query: dict[str, str]) -> None:
        repo = self._repo(repo_id)
        revision = unquote(rest[0]) if rest else "main"
        if action in ("info", "revision"):
            return self._info(repo, self._commit(repo, revision))
        if action == "refs":
            return self._refs(repo)
        if action == "tree":
            path = unquote("/".join(rest[1:]))
            recursive = query.get("recursive", "").lower() in ("1", "true")
            return self._json(self._tree(self._commit(repo, revision), path, recursive))
        if action == "paths-info":
            return self._paths_info(self._commit(repo, revision))
        if action == "preupload":
            return self._preupload(repo, revision, json.loads(self._body()))
        if action == "commit":
            return self._commit_files(repo, revision)
        if action == "tag":
            return self._tag(repo, revision, json.loads(self._body()))
        raise HubError(404, f"unknown action {action}")

    def _info(self, repo: Repo, commit: Commit) -> None:
        readme = commit.files.get("README.md")
        card: dict[str, Any] = {}
        if readme is not None and readme.content is not None:
            match = re.match(r"^---\n(.*?)\n---\n", readme.content.decode(), re.S)
            card = yaml.safe_load(match.group(1)) if match else {}
        self._json(
            {
                "_id": repo.repo_id,
                "id": repo.repo_id,
                "author": repo.repo_id.split("/")[0],
                "sha": commit.oid,
                "private": repo.private,
                "gated": False,
                "disabled": False,
                "lastModified": commit.date,
                "createdAt": commit.date,
                "tags": [],
                "downloads": 0,
                "likes": 0,
                "cardData": card,
                "siblings": [{"rfilename": p} for p in sorted(commit.files)],
            }
        )

    def _refs(self, repo: Repo) -> None:
        def refs(kind: str, names: dict[str, str]) -> list[dict[str, str]]:
            return [
                {"name": n, "ref": f"refs/{kind}/{n}", "targetCommit": oid}
                for n, oid in sorted(names.items())
            ]

        self._json(
            {
                "branches": refs("heads", repo.branches),
                "tags": refs("tags", repo.tags),
                "converts": [],
                "pullRequests": [],
            }
        )

    def _tree(self, commit: Commit, path: str, recursive: bool) -> list[dict[str, Any]]:
        prefix = f"{path.strip('/')}/" if path.strip("/") else ""
        if prefix and not any(p.startswith(prefix) for p in commit.files):
            raise HubError(404, f"{path} does not exist", "EntryNotFound")
        rows: dict[str, dict[str, Any]] = {}
        for name, entry in sorted(commit.files.items()):
            if not name.startswith(prefix):
                continue
            pieces = name[len(prefix) :].split("/")
            for depth in range(1, len(pieces)):
                folder = prefix + "/".join(pieces[:depth])
                rows.setdefault(folder, {"type": "directory", "oid": "0" * 40, "size": 0})
                rows[folder]["path"] = folder
                if not recursive:
                    break
            if recursive or len(pieces) == 1:
                rows[name] = entry.info(name)
        return list(rows.values())

    def _paths_info(self, commit: Commit) -> None:
        raw = self._body()
        if self.headers.get("Content-Type", "").startswith("application/json"):
            paths = json.loads(raw).get("paths", [])
        else:
            paths = parse_qs(raw.decode()).get("paths", [])
        found = []
        for path in paths:
            path = path.strip("/")
            if path in commit.files:
                found.append(commit.files[path].info(path))
            elif any(p.startswith(path + "/") for p in commit.files):
                found.append({"type": "directory", "oid": "0" * 40, "size": 0, "path": path})
        self._json(found)

    def _resolve(self, repo: Repo, revision: str, path: str) -> None:
        commit = self._commit(repo, revision)
        entry = commit.files.get(path)
        if entry is None:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound")
        data = self.state.lfs[entry.lfs_oid] if entry.lfs_oid else entry.content or b""
        etag = entry.lfs_oid or entry.oid
        headers = {"X-Repo-Commit": commit.oid, "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
        if entry.lfs_oid:
            headers["X-Linked-Etag"] = f'"{etag}"'
            headers["X-Linked-Size"] = str(entry.size)
        status, wanted = 200, self.headers.get("Range")
        if wanted and self.command == "GET":
            start_s, _, end_s = wanted.removeprefix("bytes=").partition("-")
            start = int(start_s) if start_s else max(len(data) - int(end_s), 0)
            end = min(int(end_s), len(data) - 1) if start_s and end_s else len(data) - 1
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            data, status = data[start : end + 1], 206
        self._send(status, data, headers)

    # writes ---------------------------------------------------------------------------------
    def _preupload(self, repo: Repo, revision: str, body: dict[str, Any]) -> None:
        self._require_write(repo.repo_id.split("/")[0])
        commit = self._commit(repo, revision)
        files = []
        for item in body.get("files", []):
            path, lfs = item["path"], item["path"].endswith(LFS_SUFFIXES)
            existing = commit.files.get(path)
            remote = None
            if existing is not None:
                remote = existing.lfs_oid if existing.lfs_oid else existing.oid
            mode = "lfs" if lfs else "regular"
            files.append({"path": path, "uploadMode": mode, "shouldIgnore": False, "oid": remote})
        self._json({"files": files, "commitOid": commit.oid})

    def _lfs_batch(self, repo_id: str, body: dict[str, Any]) -> None:
        self._require_write(repo_id.split("/")[0])
        objects = []
        for obj in body.get("objects", []):
            row: dict[str, Any] = {"oid": obj["oid"], "size": obj["size"]}
            if obj["oid"] not in self.state.lfs:
                href = f"{self.server.url}/lfs-upload/{obj['oid']}"
                row["actions"] = {"upload": {"href": href, "header": {}}}
            objects.append(row)
        self._json({"transfer": "basic", "objects": objects})

    def _lfs_put(self, oid: str) -> None:
        data = self._body()
        if hashlib.sha256(data).hexdigest() != oid:
            raise HubError(400, "sha256 mismatch")
        self.state.lfs[oid] = data
        self._send(200, b"")

    def _commit_files(self, repo: Repo, revision: str) -> None:
        self._require_write(repo.repo_id.split("/")[0])
        if self.state.fail_commits:
            raise HubError(500, "Internal Error - commit failed")
        if revision not in repo.branches:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        lines = [json.loads(line) for line in self._body().splitlines() if line.strip()]
        files = dict(repo.resolve(revision).files)
        title = "commit"
        for line in lines:
            key, value = line["key"], line["value"]
            if key == "header":
                title = value.get("summary") or title
            elif key == "file":
                content = base64.b64decode(value["content"])
                files[value["path"]] = Entry(len(content), content=content)
            elif key == "lfsFile":
                if value["oid"] not in self.state.lfs:
                    raise HubError(400, f"LFS object {value['oid']} was never uploaded")
                files[value["path"]] = Entry(value["size"], lfs_oid=value["oid"])
            elif key == "deletedFile":
                if files.pop(value["path"], None) is None:
                    raise HubError(404, "A file with this name doesn't exist", "EntryNotFound")
            elif key == "deletedFolder":
                folder = value["path"].rstrip("/") + "/"
                files = {p: e for p, e in files.items() if not p.startswith(folder)}
        new = repo.commit(revision, title, files)
        url = f"{self.server.url}/datasets/{repo.repo_id}/commit/{new.oid}"
        self._json({"success": True, "commitOid": new.oid, "commitUrl": url})

    def _tag(self, repo: Repo, revision: str, body: dict[str, Any]) -> None:
        self._require_write(repo.repo_id.split("/")[0])
        commit = self._commit(repo, revision)
        if body["tag"] in repo.tags:
            raise HubError(409, f"Tag {body['tag']} already exists")
        repo.tags[body["tag"]] = commit.oid
        self._json({"name": body["tag"]})


class HubServer(ThreadingHTTPServer):
    """``with HubServer(tokens) as hub:`` serves on ``hub.url`` in a background thread."""

    daemon_threads = True

    def __init__(self, tokens: dict[str, list[str]]) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.state = HubState(tokens)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()


def client_env(hub: HubServer, token: str, home: str) -> dict[str, str]:
    """The environment for the real clients in a subprocess to use ``hub`` (they read it
    when imported): its endpoint and token, a private HF_HOME, no Xet, no telemetry, no
    progress bars."""
    import os

    return {
        **os.environ,
        "HF_ENDPOINT": hub.url,
        "HF_TOKEN": token,
        "HF_HOME": home,
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
        "NO_PROXY": "127.0.0.1",
    }
