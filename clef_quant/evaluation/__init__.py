"""Evaluation harness: task files -> SystemOne records (build-data), and bf16 vs candidates through the plugin (eval).

build-data: `tasks` (task files and the small expression language they use), `sources` (dataset splits from the
Hub or a local Parquet copy), `sampling` (records drawn from the splits), `build` (writing a DATA folder), `data`
(the DATA folder layout and reading it back).
eval: `config` (what a run compares), `sides` (reference, noise floor, candidates), `engines` (the plugin's
engines), `scoring` (probabilities through transformers or the plugin), `store` (per-record probabilities kept
between runs), `metrics` (the one metric registry), `comparison` (sides against the reference), `runner` (the run
itself), `results` (the results dict), `report` (results.json / .csv / .md).
"""
