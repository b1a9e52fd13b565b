"""A small stand-in for the Hugging Face Hub's HTTP API on loopback, for upload tests. It records every call.

It speaks what `HfApi.create_repo`, `create_branch` and `create_commit` send, as huggingface_hub 1.x sends it:
`POST /api/repos/create`, `POST /api/validate-yaml`, `POST /api/models/{repo}/preupload/{rev}`, the LFS batch API
(`POST /{repo}.git/info/lfs/objects/batch`, then `PUT` of each object and a verify `POST`),
`POST /api/models/{repo}/branch/{branch}` and `POST /api/models/{repo}/commit/{rev}` (ndjson). Like the Hub it
asks for LFS for `*.safetensors`, `*.png` and files over 10 MiB, and checks each LFS object's sha256 on arrival
and on commit. Xet is not spoken: tests set HF_HUB_DISABLE_XET=1 so the library takes the LFS path.
Anything else gets a 404 and stays in `calls`, so a test can assert that nothing unexpected was asked.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import yaml

LFS_SUFFIXES = (".safetensors", ".png", ".bin")
LFS_MIN_BYTES = 10 * 1024 * 1024
# huggingface_hub fetches this registry in the background (best effort, errors swallowed); not part of an upload.
AGENT_REGISTRY = "/api/agent-harnesses"


@dataclass
class Call:
    method: str
    path: str
    status: int


@dataclass
class Repo:
    private: bool
    branches: dict[str, dict[str, bytes]] = field(default_factory=lambda: {"main": {}})
    commits: list[dict[str, Any]] = field(default_factory=list)


class LocalHub:
    """`with LocalHub(token) as hub:` serves on http://127.0.0.1:<port> (`hub.url`) until the block ends."""

    def __init__(self, token: str, *, refuse_create: bool = False) -> None:
        self.token = token
        self.refuse_create = refuse_create  # answer repo creation with 403, as for a namespace without rights
        self.calls: list[Call] = []
        self.repos: dict[str, Repo] = {}
        self.lfs: dict[str, bytes] = {}
        self.validated: list[str] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> LocalHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def calls_to(self, pattern: str) -> list[Call]:
        return [c for c in self.calls if re.search(pattern, c.path)]

    # -- request handling -----------------------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                hub._dispatch(self, "POST")

            def do_PUT(self) -> None:
                hub._dispatch(self, "PUT")

            def do_GET(self) -> None:
                hub._dispatch(self, "GET")

            def do_HEAD(self) -> None:
                hub._dispatch(self, "HEAD")

        return Handler

    def _dispatch(self, request: BaseHTTPRequestHandler, method: str) -> None:
        length = int(request.headers.get("Content-Length") or 0)
        body = request.rfile.read(length) if length else b""
        path = request.path.split("?", 1)[0]
        with self._lock:
            status, payload, content_type = self._route(method, path, body, request.headers.get("Authorization"))
            self.calls.append(Call(method, path, status))
        data = json.dumps(payload).encode() if payload is not None else b""
        request.send_response(status)
        request.send_header("Content-Type", content_type)
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        if method != "HEAD":
            request.wfile.write(data)

    def _route(self, method: str, path: str, body: bytes, auth: str | None) -> tuple[int, Any, str]:
        as_json = "application/json"
        if path == AGENT_REGISTRY:
            return 404, {"error": "not served by the test Hub"}, as_json
        # LFS upload URLs are presigned storage URLs: the library sends them no token, as to S3.
        if auth != f"Bearer {self.token}" and not path.startswith("/lfs-upload/"):
            return 401, {"error": "Invalid credentials in Authorization header"}, as_json
        if method == "POST" and path == "/api/repos/create":
            return (*self._create_repo(json.loads(body)), as_json)
        if method == "POST" and path == "/api/validate-yaml":
            return (*self._validate_yaml(json.loads(body)), as_json)
        if match := re.fullmatch(r"/api/models/([^/]+/[^/]+)/preupload/([^/]+)", path):
            return (*self._preupload(match[1], match[2], json.loads(body)), as_json)
        if match := re.fullmatch(r"/([^/]+/[^/]+)\.git/info/lfs/objects/batch", path):
            return (*self._lfs_batch(match[1], json.loads(body)), "application/vnd.git-lfs+json")
        if method == "PUT" and (match := re.fullmatch(r"/lfs-upload/([0-9a-f]{64})", path)):
            return (*self._lfs_put(match[1], body), as_json)
        if method == "POST" and (match := re.fullmatch(r"/lfs-verify/([0-9a-f]{64})", path)):
            found = match[1] in self.lfs
            return (200, {}, as_json) if found else (404, {"error": "object not uploaded"}, as_json)
        if method == "POST" and (match := re.fullmatch(r"/api/models/([^/]+/[^/]+)/branch/([^/]+)", path)):
            return (*self._create_branch(match[1], match[2]), as_json)
        if method == "POST" and (match := re.fullmatch(r"/api/models/([^/]+/[^/]+)/commit/([^/]+)", path)):
            return (*self._commit(match[1], match[2], body), as_json)
        return 404, {"error": f"no route for {method} {path} in the test Hub"}, as_json

    def _create_repo(self, payload: dict[str, Any]) -> tuple[int, Any]:
        if self.refuse_create:
            return 403, {"error": "You don't have the rights to create a model under this namespace"}
        repo_id = f"{payload['organization']}/{payload['name']}"
        if repo_id in self.repos:
            return 409, {"error": "You already created this model repo", "url": f"{self.url}/{repo_id}"}
        self.repos[repo_id] = Repo(private=payload.get("visibility") == "private")
        return 200, {"url": f"{self.url}/{repo_id}", "name": repo_id}

    def _validate_yaml(self, payload: dict[str, Any]) -> tuple[int, Any]:
        content = payload.get("content", "")
        self.validated.append(content)
        match = re.match(r"^---\n(.*?)\n---\n", content, flags=re.DOTALL)
        try:
            data = yaml.safe_load(match[1]) if match else None
        except yaml.YAMLError as exc:
            return 400, {"errors": [{"message": f"invalid YAML: {exc}"}]}
        if not isinstance(data, dict):
            return 400, {"errors": [{"message": "the card has no YAML front matter"}]}
        return 200, {"errors": [], "warnings": []}

    def _preupload(self, repo_id: str, revision: str, payload: dict[str, Any]) -> tuple[int, Any]:
        repo = self.repos.get(repo_id)
        if repo is None or revision not in repo.branches:
            return 404, {"error": "Repository or revision not found"}
        files = []
        for item in payload["files"]:
            lfs = item["path"].endswith(LFS_SUFFIXES) or item["size"] >= LFS_MIN_BYTES
            files.append({"path": item["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False})
        return 200, {"files": files, "commitOid": "0" * 40}

    def _lfs_batch(self, repo_id: str, payload: dict[str, Any]) -> tuple[int, Any]:
        if repo_id not in self.repos:
            return 404, {"message": "Repository not found"}
        objects = []
        for item in payload["objects"]:
            oid, size = item["oid"], item["size"]
            entry: dict[str, Any] = {"oid": oid, "size": size, "authenticated": True}
            if oid not in self.lfs:
                entry["actions"] = {
                    "upload": {"href": f"{self.url}/lfs-upload/{oid}"},
                    "verify": {"href": f"{self.url}/lfs-verify/{oid}"},
                }
            objects.append(entry)
        return 200, {"transfer": "basic", "objects": objects}

    def _lfs_put(self, oid: str, body: bytes) -> tuple[int, Any]:
        if hashlib.sha256(body).hexdigest() != oid:
            return 400, {"error": "content does not match its oid"}
        self.lfs[oid] = body
        return 200, None

    def _create_branch(self, repo_id: str, branch: str) -> tuple[int, Any]:
        repo = self.repos.get(repo_id)
        if repo is None:
            return 404, {"error": "Repository not found"}
        if branch in repo.branches:
            return 409, {"error": f"Reference refs/heads/{branch} already exists"}
        repo.branches[branch] = dict(repo.branches["main"])
        return 200, {}

    def _commit(self, repo_id: str, revision: str, body: bytes) -> tuple[int, Any]:
        repo = self.repos.get(repo_id)
        if repo is None or revision not in repo.branches:
            return 404, {"error": "Repository or revision not found"}
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        header = next(item["value"] for item in lines if item["key"] == "header")
        files: dict[str, bytes] = {}
        via_lfs: list[str] = []
        for item in lines:
            value = item["value"]
            if item["key"] == "file":
                files[value["path"]] = base64.b64decode(value["content"])
            elif item["key"] == "lfsFile":
                if value["oid"] not in self.lfs:
                    return 400, {"error": f"LFS object of {value['path']} was never uploaded"}
                files[value["path"]] = self.lfs[value["oid"]]
                via_lfs.append(value["path"])
            elif item["key"] != "header":
                return 400, {"error": f"unsupported operation {item['key']}"}
        repo.branches[revision].update(files)
        oid = hashlib.sha1(json.dumps(sorted(files)).encode() + str(len(repo.commits)).encode()).hexdigest()
        repo.commits.append({"revision": revision, "summary": header["summary"], "files": files, "lfs": via_lfs})
        return 200, {"commitUrl": f"{self.url}/{repo_id}/commit/{oid}", "commitOid": oid, "pullRequestUrl": None}
