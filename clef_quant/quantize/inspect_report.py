"""What `clef-quant inspect` finds in a folder: its Linear modules, each check's result and the violations."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from clef_quant.families import Family
from clef_quant.formatting import first_few

CHECK_KEEP = "keep-list stays bf16"
CHECK_FUSED = "fused groups share scheme and global scale"
CHECK_CONSISTENT = "config matches stored tensors"
CHECK_MANIFEST = "manifest hashes"
CHECK_HEAD = "head files present"
CHECK_CODE = "no code unless included on purpose"
CHECK_COMPLETE = "finished release"
# The load-safety audit (audit.py): what engines we do not run load without complaint and then get wrong. Its
# fourth rule, fused groups sharing one global scale, is CHECK_FUSED.
CHECK_SCALES = "scales finite and positive"
CHECK_ZEROS = "no zeroed rows or blocks"
CHECK_TARGETS = "ignore and targets match modules"
CHECK_NAMES = "tensor names the architecture loads"

SOURCE = "source"
RELEASE = "release"
UNFINISHED = "unfinished"


@dataclass(frozen=True)
class LinearInfo:
    name: str
    kind: str
    shape: tuple[int, ...]  # (out_features, in_features) of the dense weight
    scheme: str  # label from the config (FP8_DYNAMIC, NVFP4, ...) or "bf16"
    stored: str  # what the tensors are: their dtype, or e.g. "fp4 packed + F8_E4M3 scales"
    quantized: bool  # by the stored tensors

    @property
    def params(self) -> int:
        total = 1
        for dim in self.shape:
            total *= dim
        return total


@dataclass(frozen=True)
class Violation:
    check: str
    subject: str  # a module, layer or file name
    message: str

    def __str__(self) -> str:
        return f"{self.subject}: {self.message}"


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str  # "pass", "fail" or "skipped"
    detail: str


FIRST_OFFENDERS = 3


def check_result(check: str, violations: list[Violation], detail_ok: str) -> CheckResult:
    """`check`'s line of the summary: a pass with `detail_ok`, or a fail naming its first offenders."""
    failed = [v.subject for v in violations if v.check == check]
    if not failed:
        return CheckResult(check, "pass", detail_ok)
    subjects = list(dict.fromkeys(failed))  # one tensor may break a rule twice (not in the index, not the model's)
    return CheckResult(check, "fail", f"{len(failed)} violation(s): {first_few(subjects, FIRST_OFFENDERS, ', ')}")


@dataclass
class InspectReport:
    folder: Path
    modules: list[LinearInfo]
    checks: list[CheckResult]
    violations: list[Violation]
    notes: list[str] = field(default_factory=list)
    kind: str = RELEASE  # RELEASE, SOURCE (a bf16 source release) or UNFINISHED (nothing but that was read)
    family: Family | None = None  # which Clef model the folder is (None: not one of them)

    @property
    def ok(self) -> bool:
        return not self.violations

    def totals_by_kind(self) -> dict[str, dict[str, int]]:
        """kind -> {scheme label: module count}, kinds in first-seen order."""
        totals: dict[str, dict[str, int]] = {}
        for module in self.modules:
            counts = totals.setdefault(module.kind, {})
            counts[module.scheme] = counts.get(module.scheme, 0) + 1
        return totals

    def module(self, name: str) -> LinearInfo:
        return next(m for m in self.modules if m.name == name)
