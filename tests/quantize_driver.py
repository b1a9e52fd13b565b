"""Run `clef-quant` exactly as a user does, but held at chosen stages of quantize, so a test can force an order.

    python tests/quantize_driver.py CONTROL_DIR STAGE[,STAGE...] -- quantize SOURCE --scheme ... --out ...

At each named stage the run writes `CONTROL_DIR/<stage>.reached` (its PID) and waits until the test creates
`CONTROL_DIR/<stage>.go`; meanwhile the test can start another run, send a signal or SIGKILL this one. The hook
is passed through quantize's own `on_stage` parameter: production code holds no test switch.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path

WAIT_LIMIT_S = 300.0


def hold_at(control: Path, stages: set[str]):
    def on_stage(stage: str) -> None:
        if stage not in stages:
            return
        (control / f"{stage}.reached").write_text(str(os.getpid()))
        deadline = time.monotonic() + WAIT_LIMIT_S
        while not (control / f"{stage}.go").exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"held at {stage} for {WAIT_LIMIT_S:.0f} s without a go")
            time.sleep(0.02)

    return on_stage


def main() -> None:
    control, stages, separator, *args = sys.argv[1:]
    assert separator == "--", "usage: quantize_driver.py CONTROL_DIR STAGES -- CLI ARGS"
    import clef_quant.quantize.run as run

    run.quantize = functools.partial(run.quantize, on_stage=hold_at(Path(control), set(stages.split(","))))
    from clef_quant.cli import main as cli_main

    sys.argv = ["clef-quant", *args]
    cli_main()


if __name__ == "__main__":
    main()
