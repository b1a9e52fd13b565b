"""Push a carded release folder to the Hugging Face Hub, all of it or nothing.

The sequence: check the folder (inspect passes, which includes every manifest hash; the card is there; the card was
written for this repo id), then create the repo if it is missing, create the branch if one is asked for and
missing, and push exactly the manifest's files plus the manifest in one commit. `HfApi.create_commit` is used
rather than `upload_folder` because with `hf_xet` installed `upload_folder` may split a large folder into several
commits, and a half-pushed release must never be visible. Large files go through the library's own transfer
(Xet, or LFS where Xet is off or unavailable); the Hub validates the card's front matter before anything is sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clef_quant.publish.errors import PublishError
from clef_quant.release_folder.manifest import CARD_FILE, MANIFEST_FILE, read_manifest
from clef_vllm.errors import CheckpointError
from clef_vllm.format.release_source import is_hub_id

DEFAULT_BRANCH = "main"


class ReleaseNotReady(PublishError):
    """The folder fails one or more of upload's checks; `problems` lists every one."""

    def __init__(self, folder: Path, problems: list[str]) -> None:
        super().__init__(f"{folder} is not ready to upload: {len(problems)} problem(s)")
        self.problems = problems


@dataclass(frozen=True)
class UploadFile:
    path: str  # relative to the folder, as it will be named in the repo
    size: int


@dataclass(frozen=True)
class UploadPlan:
    folder: Path
    repo_id: str
    private: bool
    revision: str  # the branch the commit goes to
    files: list[UploadFile]
    commit_message: str
    commit_description: str

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def new_branch(self) -> bool:
        return self.revision != DEFAULT_BRANCH


@dataclass(frozen=True)
class UploadResult:
    repo_url: str
    commit_url: str
    commit_oid: str


def validate_repo_id(repo_id: str) -> None:
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id as hub_validate

    if not is_hub_id(repo_id):
        raise PublishError(f"--repo-id must be ORG/NAME, not {repo_id!r}")
    try:
        hub_validate(repo_id)
    except HFValidationError as exc:
        raise PublishError(f"--repo-id {repo_id!r} is not a valid Hub repo id: {str(exc).splitlines()[0]}") from None


def check_release(folder: Path, repo_id: str | None = None) -> list[str]:
    """Every reason `folder` must not be uploaded (empty when it may): inspect violations (including every file
    whose hash differs from the manifest), a missing card, a card written for another repo id."""
    from clef_quant.quantize.inspect import inspect_checkpoint

    folder = Path(folder)
    if not folder.is_dir():
        return [f"{folder} is not a folder"]
    manifest = read_manifest(folder)
    if manifest is None:
        return [f"{MANIFEST_FILE} is missing: make the folder with clef-quant quantize"]
    try:
        problems = [f"{v.subject}: {v.message}" for v in inspect_checkpoint(folder).violations]
    except CheckpointError as exc:  # no config.json or no weights: nothing else is worth checking
        return [str(exc)]
    card = manifest.card
    if not (folder / CARD_FILE).is_file() or card is None:
        problems.append(f"{CARD_FILE}: no model card; write it with clef-quant card {folder} --results RESULTS")
    elif repo_id is not None and card.repo_id not in (None, repo_id):
        problems.append(
            f"{CARD_FILE}: written for {card.repo_id}, not {repo_id} (its quickstart names the repo); "
            f"re-run clef-quant card with --repo-id {repo_id}"
        )
    return problems


def plan_upload(folder: Path, *, repo_id: str, private: bool = False, revision: str | None = None) -> UploadPlan:
    """Check `folder` and describe the upload; raises ReleaseNotReady listing every problem."""
    folder = Path(folder)
    validate_repo_id(repo_id)
    problems = check_release(folder, repo_id)
    if problems:
        raise ReleaseNotReady(folder, problems)
    manifest = read_manifest(folder)
    assert manifest is not None  # check_release refuses a folder without one
    files = [UploadFile(name, entry.size) for name, entry in sorted(manifest.files.items())]
    files.append(UploadFile(MANIFEST_FILE, (folder / MANIFEST_FILE).stat().st_size))
    message = f"{manifest.scheme} release made by clef-quant {manifest.tools.get('clef-quant') or '?'}"
    base_model = (manifest.card.base_model if manifest.card is not None else None) or manifest.source.id
    description = "\n".join(
        [
            f"Base model: {base_model}",
            f"Scheme: {manifest.scheme}",
            f"Files: {len(files)}, sha256 of each in {MANIFEST_FILE}",
            "Check it with: clef-quant inspect <folder>",
        ]
    )
    return UploadPlan(folder, repo_id, private, revision or DEFAULT_BRANCH, files, message, description)


def find_token() -> str | None:
    """The token huggingface_hub would use: HF_TOKEN, else the one stored by `hf auth login`."""
    from huggingface_hub import get_token

    return get_token()


def upload(plan: UploadPlan, token: str) -> UploadResult:
    """Create the repo (and branch) when missing and push the planned files in one commit."""
    import httpx
    from huggingface_hub import CommitOperationAdd, HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(token=token)
    step = "create the repo"
    try:
        repo_url = api.create_repo(plan.repo_id, private=plan.private, exist_ok=True)
        if plan.new_branch:
            step = f"create branch {plan.revision}"
            api.create_branch(plan.repo_id, branch=plan.revision, exist_ok=True)
        step = "commit the files"
        operations = [
            CommitOperationAdd(path_in_repo=f.path, path_or_fileobj=str(plan.folder / f.path)) for f in plan.files
        ]
        info = api.create_commit(
            plan.repo_id,
            operations=operations,
            commit_message=plan.commit_message,
            commit_description=plan.commit_description,
            revision=plan.revision,
        )
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "no response"
        reason = str(exc).splitlines()[0]
        raise PublishError(f"the Hub refused to {step} for {plan.repo_id} ({status}): {reason}") from None
    except httpx.TransportError as exc:
        raise PublishError(f"cannot reach the Hub at {api.endpoint} to {step}: {type(exc).__name__}") from None
    except (ValueError, RuntimeError) as exc:
        # The library's own refusals (front matter the Hub calls invalid) and failed transfers, which it wraps
        # in RuntimeError with the HTTP error as the cause.
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        detail = " ".join(str(cause).split()) or type(cause).__name__
        raise PublishError(f"could not {step} for {plan.repo_id}: {' '.join(str(exc).split())} ({detail})") from None
    return UploadResult(str(repo_url), info.commit_url, info.oid)
