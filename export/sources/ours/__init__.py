"""Our own Transformer as a source: the model, its checkpoints and tokenizer, its PyTorch
reference decoding, and its wrappers into the translation ONNX layout (``source.load_ours``)."""
