"""Compression verbs: distill, prune, quantize."""
