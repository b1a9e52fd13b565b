"""The joint schema head: its math (`model`), the operations it shares with the graphed GPU path (`ops`,
`graphs`), and its files in a release (`files`). It builds on `clef_vllm.format`."""
