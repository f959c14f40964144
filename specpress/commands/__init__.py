"""Click commands, one module per verb, imported lazily by specpress.cli through COMMANDS: importing this package
imports none of them."""

from __future__ import annotations

# name -> (module, attribute, one-line help). Only commands that exist are listed.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "zoo": ("specpress.commands.zoo", "zoo", "Build the built-in tiny target (trained here on the Python stdlib)."),
    "inspect": ("specpress.commands.inspect", "inspect_cmd",
                "Show family, parameters, bytes and provenance of a model or drafter."),
    "regenerate": ("specpress.commands.regenerate", "regenerate",
                   "Continue corpus prompts with the target: distillation data that says what it emits."),
    "distill": ("specpress.commands.distill", "distill", "Train a drafter against a target (or shrink a drafter)."),
    "prune": ("specpress.commands.prune", "prune",
              "Prune FFN channels, KV groups, layers or draft vocabulary: a smaller dense drafter."),
    "prompts": ("specpress.commands.prompts", "prompts",
                "Write held-out prompts (third-party code the zoo never saw) for bench --prompts."),
    "run": ("specpress.commands.decode", "run", "Decode one prompt and print the text."),
    "bench": ("specpress.commands.decode", "bench", "Decode a prompt file and write the metrics JSON."),
    "quantize": ("specpress.commands.quantize", "quantize",
                 "Quantize a drafter's weights (int8/int4, nf4/fp4, fp8): bytes and acc@k before/after."),
    "export": ("specpress.commands.export", "export",
               "Export a drafter (ONNX graphs, TensorRT engines, serving formats) or a target's forward."),
    "plan": ("specpress.commands.plan", "plan",
             "Before running a command: its peak memory and work (target forwards, tokens), from configs alone."),
    "sweep": ("specpress.commands.sweep", "sweep",
              "Run a recipe: a grid of compressed drafters, each benched against the base (table, plots, Pareto)."),
}
