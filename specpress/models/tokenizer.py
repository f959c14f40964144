"""The tokenizer of a model directory (`tokenizer.json`, read with the `tokenizers` library)."""

from __future__ import annotations

from pathlib import Path

from specpress.errors import CheckpointError, RequestError


def load_tokenizer(model_dir: str | Path):  # -> tokenizers.Tokenizer
    from tokenizers import Tokenizer

    f = Path(model_dir).expanduser() / "tokenizer.json"
    if not f.is_file():
        raise RequestError(f"{model_dir} has no tokenizer.json, needed to encode text; copy the model's "
                           f"tokenizer.json into it")
    try:
        return Tokenizer.from_file(str(f))
    except Exception as exc:  # tokenizers raises a plain Exception subclass for bad files
        raise CheckpointError(f"{f} could not be read ({exc})") from None
