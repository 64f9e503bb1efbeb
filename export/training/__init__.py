"""Training our Transformer (``train``), distillation data from a teacher (``distill``) and the
checkpoint's sacreBLEU (``evaluate``): they make the checkpoints that export/sources/ours reads,
and nothing in the export's stages imports them."""
