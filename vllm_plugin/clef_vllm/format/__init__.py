"""The release format, pure (no engine, no HTTP): the SystemOne request and its limits, the record schema, media,
the prompt and its spans (encoding, state cut), the answers, strict JSON, the release manifest and sources."""
