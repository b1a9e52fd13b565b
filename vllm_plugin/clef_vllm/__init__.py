"""Clef decision models on vLLM: release format, joint schema head, pooling model and SystemOne server.

The format modules (`request`, `encoding`, `answers`) and the head (`head`) are pure: no engine, no HTTP.
"""

__version__ = "0.1.0"
