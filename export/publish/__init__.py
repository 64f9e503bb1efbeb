"""The export's last stage: each variant's manifest and its publishing, staged, verified and
then moved into place (``variants``), the same way for every task; ``translation`` writes its
task's manifest and says when a published variant is still up to date, ``embedding`` says it for
embeddings (whose manifest, as the reranker's, export/encoder_export.py writes)."""
