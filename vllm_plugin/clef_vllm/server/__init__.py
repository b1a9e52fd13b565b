"""`clef-systemone`: the SystemOne HTTP API (`POST /v1/systemone`) over a vLLM engine with the Clef plugin."""
