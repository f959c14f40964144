"""--target-quant / --target-quant-data: the options `run`, `bench`, `distill` and `quantize` share. The steps
taken with them live in the library and are imported here for the commands: parsing and checking the two options
before anything loads (`parse_spec`, compress/quantize/target.py), and compressing a copy of the loaded target,
benching the float one beside it and saying what changed (decode/target_quant_steps.py).
Torch-free at import, like every command module."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from specpress.models.quantized.names import SCHEME_WORDS
from specpress.decode.target_quant_steps import (  # noqa: F401  (the steps the commands take, kept beside them)
    check_target_backend,
    comparison_lines,
    compress_target,
    float_reference,
    greedy_drift,
    summary_line,
)

SPEC_HELP = ("SCHEME[:key=value,...]: SCHEME is none (float weights) or " + ", ".join(SCHEME_WORDS) + "; keys "
             "method=rtn|gptq|awq|smoothquant|bnb, group=G, symmetric=true|false, activations=none|dynamic|static, "
             "calibration=max|mse|percentile:P|fixed:V|weights, kv=fp8, include=A+B, exclude=A+B. E.g. int8 (W8A16), "
             "fp8 (W8A8, per-token activations), int4 (W4A16, groups of 64), nvfp4:activations=static (W4A4), "
             "none:kv=fp8 (float weights, fp8 KV cache)")
DATA_HELP = ("Calibration data for a --target-quant that runs the target on data (method=gptq / awq / smoothquant, "
             "static activation scales): zoo:train, a text file or directory, or a .jsonl of text or input_ids; "
             "8 batches of 4 x 128-token windows")


def target_quant_options(what: str, data_default: str | None = None) -> Callable[[Any], Any]:
    """The two options, their help saying what `what` does with the compressed target."""
    data_help = DATA_HELP + (f"  [default: {data_default}]" if data_default else "")

    def deco(fn: Any) -> Any:
        fn = click.option("--target-quant-data", "target_quant_data", default=None, metavar="DATA",
                          help=data_help + ".")(fn)
        return click.option("--target-quant", "target_quant", default=None, metavar="SPEC",
                            help=f"Compress the target first, with a drafter quantization scheme, and {what}. "
                                 f"Its decoder Linears are quantized (embeddings and lm_head stay float unless "
                                 f"include=lm_head) and computed as the scheme's reference: fake-quantized "
                                 f"input x dequantized weight, in the target's dtype (emulated on CPU: it "
                                 f"measures acceptance, not speed). {SPEC_HELP}.")(fn)

    return deco
