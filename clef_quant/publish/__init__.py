"""Publishing a quantized release: the model card (`card`) and the Hub upload (`upload`).

The sequence: `clef-quant quantize` writes DIR with its manifest; `clef-quant eval` writes RESULTS;
`clef-quant card DIR --results RESULTS` checks DIR against its manifest, renders `README.md` and the plots from the
manifest, the stored tensors and RESULTS, copies the serving package (`vllm_plugin/`) and the scripts (`scripts/`)
into DIR, and adds every file it wrote to the manifest; `clef-quant upload DIR --repo-id ORG/NAME` checks DIR again
(inspect, card present, every hash) and pushes exactly the manifest's files in one Hub commit.
"""
