"""The checks `clef-quant inspect` runs on a folder's modules and files; each names what is wrong as a Violation."""

from __future__ import annotations

import filecmp
from pathlib import Path
from typing import Any

from clef_quant.quantize.contents import RELEASE_CODE, code_in_folder
from clef_quant.quantize.inspect_report import (
    CHECK_CODE,
    CHECK_COMPLETE,
    CHECK_FUSED,
    CHECK_HEAD,
    CHECK_KEEP,
    CHECK_MANIFEST,
    CheckResult,
    LinearInfo,
    Violation,
)
from clef_quant.quantize.recipes import is_kept_bf16
from clef_quant.quantize.schemes import BF16, fused_groups_of
from clef_quant.quantize.stored_tensors import StoredTensor, read_tensor
from clef_quant.release_folder.manifest import MANIFEST_FILE, Manifest, not_regular, verify_manifest
from clef_quant.release_folder.writer import OWNER_FILE, PARTIAL_SUFFIX
from clef_vllm.head.files import HEAD_CONFIG, HEAD_FILES, HEAD_SUBDIR, HEAD_WEIGHTS


def unfinished_violations(folder: Path) -> list[Violation]:
    """A `.partial` is never a release, whatever it holds; reading its half-written tensors would prove nothing."""
    found = []
    if folder.name.endswith(PARTIAL_SUFFIX):
        found.append(
            Violation(
                CHECK_COMPLETE,
                str(folder),
                f"an unfinished quantize output ({PARTIAL_SUFFIX}): its run is still writing or was killed; "
                "inspect the folder the run finishes, or quantize again",
            )
        )
    if (folder / OWNER_FILE).exists():
        found.append(
            Violation(
                CHECK_COMPLETE,
                f"{folder / OWNER_FILE}",
                "a quantize run's writer marker: the run did not finish its last step; quantize again",
            )
        )
    return found


def keep_list_violations(modules: list[LinearInfo]) -> list[Violation]:
    return [
        Violation(CHECK_KEEP, m.name, f"must stay bf16 but is {m.scheme} ({m.stored})")
        for m in modules
        if is_kept_bf16(m.name) and (m.quantized or m.scheme != BF16)
    ]


def fused_group_violations(modules: list[LinearInfo], by_module: dict[str, dict[str, StoredTensor]]) -> list[Violation]:
    info = {m.name: m for m in modules}
    violations = []
    for parent, members in fused_groups_of(list(info)):
        short = [m.rsplit(".", 1)[1] for m in members]
        labels = [info[m].scheme for m in members]
        if len(set(labels)) > 1:
            described = ", ".join(f"{s}={lab}" for s, lab in zip(short, labels, strict=True))
            violations.append(
                Violation(CHECK_FUSED, parent, f"vLLM fuses {'+'.join(short)} but their schemes differ: {described}")
            )
            continue
        entries = [by_module[m].get("weight_global_scale") for m in members]
        if any(entry is None for entry in entries):
            continue
        scales = [read_tensor(entry, f"{m}.weight_global_scale") for entry, m in zip(entries, members, strict=True)]
        if any(not _same(scales[0], other) for other in scales[1:]):
            values = ", ".join(f"{s}={_scalar(t)}" for s, t in zip(short, scales, strict=True))
            violations.append(
                Violation(
                    CHECK_FUSED,
                    parent,
                    f"weight_global_scale differs across {'+'.join(short)} ({values}); vLLM fuses them into "
                    "one GEMM with one scale",
                )
            )
    return violations


def _same(a: Any, b: Any) -> bool:
    import torch

    return a.shape == b.shape and bool(torch.equal(a, b))


def _scalar(tensor: Any) -> str:
    values = tensor.flatten().tolist()
    return f"{values[0]:g}" if len(values) == 1 else str(values[:4])


def check_manifest(
    folder: Path,
    manifest: Manifest | None,
    error: str | None,
    is_source: bool,
    verify_hashes: bool,
    violations: list[Violation],
) -> CheckResult:
    if manifest is None and error is None and is_source:
        return CheckResult(CHECK_MANIFEST, "skipped", "a source release has none")
    links = not_regular(folder)
    for name, what in links.items():
        violations.append(Violation(CHECK_MANIFEST, name, f"{what}; a release holds regular files only"))
    if error is not None:
        violations.append(Violation(CHECK_MANIFEST, MANIFEST_FILE, error.replace(f"{folder / MANIFEST_FILE} ", "")))
        return CheckResult(CHECK_MANIFEST, "fail", "unreadable manifest")
    if manifest is None:
        violations.append(
            Violation(
                CHECK_MANIFEST,
                MANIFEST_FILE,
                "missing: a quantized folder without a manifest is unfinished or was not made by clef-quant "
                "(make releases with clef-quant quantize)",
            )
        )
        return CheckResult(CHECK_MANIFEST, "fail", f"no {MANIFEST_FILE}")
    if links:
        return CheckResult(CHECK_MANIFEST, "fail", f"{len(links)} symlink(s) or other non-regular file(s)")
    if not verify_hashes:
        return CheckResult(CHECK_MANIFEST, "skipped", "hash verification turned off")
    # A listed file behind a symlink (or replaced by a pipe) is reported above, not again as missing.
    problems = [p for p in verify_manifest(folder, manifest) if p.file not in links]
    for problem in problems:
        violations.append(Violation(CHECK_MANIFEST, problem.file, problem.problem))
    if problems:
        return CheckResult(CHECK_MANIFEST, "fail", f"{len(problems)} file(s) differ from the manifest")
    return CheckResult(CHECK_MANIFEST, "pass", f"{len(manifest.files)} file(s) match")


def included_on_purpose(manifest: Manifest | None) -> set[str]:
    """What the manifest names as carried on purpose: its `included` entries and the files `card` added."""
    if manifest is None:
        return set()
    names = {entry.path for entry in manifest.included}
    return names | set(manifest.card.files if manifest.card is not None else [])


def check_code(
    folder: Path, manifest: Manifest | None, is_source: bool, violations: list[Violation], notes: list[str]
) -> CheckResult:
    found = code_in_folder(folder, skip=(MANIFEST_FILE,))
    if is_source:
        left_out = [name for name in found if name != RELEASE_CODE]
        if left_out:
            notes.append(f"code that quantize leaves out of a release: {', '.join(left_out)}")
        detail = "a source release" + (f"; {len(found)} code file(s)" if found else "")
        return CheckResult(CHECK_CODE, "skipped", detail)
    allowed = included_on_purpose(manifest)
    unvetted = [name for name in found if name not in allowed]
    for name in unvetted:
        what = "a remote-code key" if ":" in name else "may run code"
        violations.append(
            Violation(CHECK_CODE, name, f"{what}, and the manifest does not list it as included on purpose")
        )
    if unvetted:
        return CheckResult(CHECK_CODE, "fail", f"{len(unvetted)} unvetted")
    return CheckResult(CHECK_CODE, "pass", f"{len(found)} included on purpose" if found else "none")


def check_head(folder: Path, violations: list[Violation], notes: list[str]) -> CheckResult:
    """The head at the root, where every engine looks; `clef_head/` (older quantized releases) is read by clef-vllm
    only, so it passes with a note."""
    at_root = [name for name in HEAD_FILES if (folder / name).is_file()]
    legacy = [name for name in HEAD_FILES if (folder / HEAD_SUBDIR / name).is_file()]
    if len(at_root) == len(HEAD_FILES):
        for name in legacy:
            if not filecmp.cmp(folder / name, folder / HEAD_SUBDIR / name, shallow=False):
                message = f"differs from {name} at the root, which engines read"
                violations.append(Violation(CHECK_HEAD, f"{HEAD_SUBDIR}/{name}", message))
        if legacy:
            notes.append(f"{HEAD_SUBDIR}/ holds a copy of the head; engines read the one at the root")
        failed = any(v.check == CHECK_HEAD for v in violations)
        return CheckResult(CHECK_HEAD, "fail" if failed else "pass", f"{HEAD_WEIGHTS}, {HEAD_CONFIG} at the root")
    if not at_root and len(legacy) == len(HEAD_FILES):
        notes.append(
            f"the head is in {HEAD_SUBDIR}/ (the layout of older quantized releases): clef-vllm reads it, but vLLM >= "
            "0.33, SGLang and llama.cpp see no Clef model; quantize again for the root layout"
        )
        return CheckResult(CHECK_HEAD, "pass", f"{HEAD_SUBDIR}/{HEAD_WEIGHTS}, {HEAD_SUBDIR}/{HEAD_CONFIG}")
    for name in HEAD_FILES:
        if name not in at_root:
            violations.append(Violation(CHECK_HEAD, name, "missing at the release root"))
    return CheckResult(CHECK_HEAD, "fail", f"{len(HEAD_FILES) - len(at_root)} head file(s) missing")
