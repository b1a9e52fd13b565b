"""Evaluation harness: task files -> SystemOne records (build-data), and bf16 vs candidates through the plugin (eval).

Modules: `tasks` (task files and the small expression language they use), `data` (loading datasets, sampling,
DATA folders), `metrics` (the one metric registry), `store` (per-record probabilities kept between runs),
`runner` (scoring each side and comparing), `report` (results.json / .csv / .md).
"""
