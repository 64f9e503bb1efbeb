"""The export's second stage: a source's wrappers traced to ONNX, then each variant's graphs
(fp32, per-row int8, fp16) and the rewrites the service's decoder uses (in-graph top-k by blocks,
vocabulary shortlists). ``translation_layout`` is the translation graphs' I/O contract with the
service engine."""
