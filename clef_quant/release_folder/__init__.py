"""Writing and describing folders that clef-quant hands to others: releases, DATA folders, cards.

- `staged`: a folder is written as `OUT.partial`, claimed with a writer marker (`writer`), and renamed to `OUT`
  only when complete; Ctrl-C and SIGTERM (`signals`) remove it like any failure.
- `atomic`: single files replaced whole through a rename, 0644.
- `manifest`: `clef_quant.json`, the validated list of a release's files with their sha256, what it was made from,
  and the paths `card` owns; `fingerprints`: one hash over a folder's content; `versions`: installed tool versions.
"""
