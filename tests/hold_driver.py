"""Run `clef-quant` exactly as a user does, but held when it first calls one named function, so a test can signal
or kill it at that point.

    python tests/hold_driver.py CONTROL_DIR MODULE:FUNCTION -- make-tiny DIR ...

When the run calls MODULE.FUNCTION it writes `CONTROL_DIR/reached` (its PID) and waits (up to WAIT_LIMIT_S) until
the test creates `CONTROL_DIR/go`, then calls the function as usual. Replacing a module attribute leaves production
code without a test switch.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import time
from pathlib import Path

WAIT_LIMIT_S = 300.0


def held(function, control: Path):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        (control / "reached").write_text(str(os.getpid()))
        deadline = time.monotonic() + WAIT_LIMIT_S
        while not (control / "go").exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"held for {WAIT_LIMIT_S:.0f} s without a go")
            time.sleep(0.02)
        return function(*args, **kwargs)

    return wrapper


def main() -> None:
    control, target, separator, *args = sys.argv[1:]
    assert separator == "--", "usage: hold_driver.py CONTROL_DIR MODULE:FUNCTION -- CLI ARGS"
    module_name, name = target.split(":")
    module = importlib.import_module(module_name)
    setattr(module, name, held(getattr(module, name), Path(control)))
    from clef_quant.cli import main as cli_main

    sys.argv = ["clef-quant", *args]
    cli_main()


if __name__ == "__main__":
    main()
