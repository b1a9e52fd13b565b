"""Quantized Clef releases: `run.quantize` makes one, `inspect.inspect_checkpoint` checks one.

Modules: `recipes` (recipe YAML and its placeholders), `plan` (what a recipe does to a model, refused early when
wrong), `fused_scales` (one global scale per qkv/z pair), `calibration` (SystemOne requests, encoded as serving
encodes them), `schemes` (scheme names, fused groups), `streaming` (data-free schemes shard by shard, without
loading the model; `shard_writer` hashes each shard as it is written); the comparison with plain
llm-compressor is `clef-quant bench quantize-vs-plain` (`clef_quant.bench.quantize_bench`). Nothing heavy
is imported here, so the CLI starts fast. The manifest (`clef_quant.json`) and the staged output folder live
in `clef_quant.release_folder`.
"""
