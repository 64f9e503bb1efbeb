"""Training our Transformer (``train``, with what a run keeps and resumes from in ``state``),
distillation data from a teacher (``distill``), the checkpoint's sacreBLEU (``evaluate``) and runs
packed into small files and joined back (``pack``): they make the checkpoints that
export/sources/ours reads, and nothing in the export's stages imports them."""
