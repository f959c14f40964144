"""The built-in tiny target: a byte-level BPE and a Llama trained on this machine's Python stdlib."""
