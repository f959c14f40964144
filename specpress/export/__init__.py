"""Export drafters to ONNX (graphs + manifest.json), validated against torch; see export/onnx.py."""
