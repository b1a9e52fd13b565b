"""The task names a quantize run reports through `clef_quant.progress.Progress`, in order."""

from __future__ import annotations

LOADING = "loading"
ENCODING = "encoding calibration records"
CALIBRATING = "quantizing"
SAVING = "saving"
COPYING = "copying and hashing"
STREAMING = "quantizing shards"
