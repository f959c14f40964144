"""`specpress quantize`: a thin layer over specpress.compress.quantize (request.py checks and builds the
run, pipeline.py runs it, report.py says what it did)."""

from __future__ import annotations

from pathlib import Path

import click

from specpress.commands.options import target_dtype as target_dtype_option, TARGET_FORMS, TARGET_PATH
from specpress.commands.target_quant import target_quant_options
from specpress.models.quantized.names import METHOD_WORDS, SCHEME_WORDS, schemes_help


@click.command()
@click.option("--drafter", "drafter_dir", required=True, type=click.Path(path_type=Path),
              help="Drafter artifact directory (full precision).")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Drafter directory to write.")
@click.option("--scheme", type=click.Choice(SCHEME_WORDS),
              help=f"Storage format of every quantized Linear (or --budget: one per Linear). {schemes_help()}.")
@click.option("--method", type=click.Choice(METHOD_WORDS),
              help="How codes are chosen  [default: the scheme's first method, listed with --scheme]")
@click.option("--group-size", type=click.IntRange(min=1),
              help="Inputs per scale: int4 / int3 / int2 / ternary / nf4 / fp4 [64]; int8 [per output channel].")
@click.option("--symmetric/--asymmetric", default=None, help="Integer zero points  [default: symmetric]")
@click.option("--activations", type=click.Choice(["none", "dynamic", "static"]),
              help="What happens to the activations entering each quantized Linear: none (weight-only), dynamic "
                   "(scales computed per token / per block at run time) or static (one calibrated input_scale per "
                   "Linear)  [default: the form engines deploy for the scheme; see above]")
@click.option("--act-calibration", metavar="max|percentile:P|mse|fixed:V|weights",
              help="How static input scales are found: the largest |x| seen, its P-th percentile, the amax "
                   "minimizing fake-quantization MSE, a fixed amax V (no data; Model Optimizer's drafter script "
                   "uses 448 for fp8), or the layer's weight amax (no data). mse is the default: on the zoo "
                   "drafter NVFP4 W4A4 kept 98.9 %% of tau with it, 97.6 %% with max (BENCHMARKS.md)  [default: mse]")
@click.option("--calib-inputs", default="rounds", show_default=True, metavar="rounds[:POLICY]|first-step",
              help="What calibration runs the drafter on: real speculative rounds over --target (every tree level "
                   "and fed-back hidden state; POLICY defaults to the family's) or the teacher-forced first step "
                   "only (what TensorRT Edge-LLM calibrates on).")
@click.option("--kv-cache", type=click.Choice(["none", "fp8"]),
              help="The drafter's own KV cache: fp8 rounds every cached K/V vector to e4m3 with its own scale "
                   "(per token and head), as TensorRT Edge-LLM's and vLLM's fp8 KV caches hold it  [default: none]")
@click.option("--include", help="Optional modules to quantize too, comma-separated (e.g. lm_head).")
@click.option("--exclude", help="Modules to keep in full precision, comma-separated (e.g. fc,down_proj).")
@click.option("--budget", "budget_text", metavar="SIZE",
              help="Instead of --scheme: pick a scheme per Linear from --candidates so that the drafter stores at "
                   "most SIZE (1500000, 1.5MB, 1.5MiB: everything the drafter stores, as inspect counts it; or 4.5bpp: "
                   "bits per parameter of the allocated Linears), keeping the candidates where the drafter's draft "
                   "distribution moves least (--sensitivity). Pays when a uniform scheme is too big or loses too much "
                   "tau at the size you need.")
@click.option("--candidates", metavar="WORD[:gN][:METHOD],...",
              help="With --budget: the schemes a Linear may get, any --scheme word with an optional group size and "
                   "calibration-free method (int8,int4:g64,int4:g128,nf4,fp8), and float (kept unquantized)  "
                   "[default: int8,int4]")
@click.option("--sensitivity", type=click.Choice(["kl", "weight"]),
              help="With --budget: how each (Linear, candidate) is scored. kl: the mean KL of the draft distribution "
                   "to the float drafter's when that Linear alone is quantized, teacher-forced on --calib-batches "
                   "windows of --data over --target: one drafter forward pass per batch per (Linear, candidate), "
                   "seconds on a one-layer EAGLE-3, minutes for a many-layer drafter. weight: the weight's squared "
                   "quantization error, no data, instant, blind to how much the output depends on each Linear  "
                   "[default: kl with --target/--data, else weight]")
@click.option("--target", "target_dir", type=TARGET_PATH,
              help="Target model dir: the drafter runs on its hidden states (calibration, agreement)." + TARGET_FORMS)
@click.option("--data", "data_path", type=click.Path(path_type=Path),
              help="Text, .jsonl or a directory: calibration windows and held-out agreement windows.")
@click.option("--dequantize", "dequantize_out", is_flag=True,
              help="Write plain float weights (public layout) with the quantization recorded in provenance.")
@click.option("--dtype", type=click.Choice(["auto", "fp32", "bf16", "fp16"]), default="auto", show_default=True,
              help="Dtype of what stays in floating point (norms, biases, kept Linears), as stored and as the "
                   "quantized drafter computes. auto: the source's dtype when 16-bit, else bf16 (half the bytes of "
                   "those tensors; the measured acceptance is that of the rounded drafter).")
@click.option("--float-dtype", "legacy_float_dtype", hidden=True,
              type=click.Choice(["auto", "bfloat16", "float16", "float32", "bf16", "fp16", "fp32"]),
              help="Deprecated spelling of --dtype.")
@click.option("--force", is_flag=True, help="Replace an existing --out.")
@click.option("--calib-batches", type=click.IntRange(min=1),
              help="Calibration batches of --batch x --seq-len windows. GPTQ needs about twice as many input rows as "
                   "the widest Linear it quantizes has inputs, or its codes fit the calibration windows: its "
                   "default takes that many (36 for a Llama-3.2-1B EAGLE-3 drafter, 62 at 8B; each is a calibration "
                   "pass over the target), other methods 8.  [default: 8, or what GPTQ needs]")
@click.option("--batch", type=click.IntRange(min=1), default=4, show_default=True, help="Windows per batch.")
@click.option("--seq-len", type=click.IntRange(min=4), default=128, show_default=True, help="Tokens per window.")
@click.option("--eval-batches", type=click.IntRange(min=1), default=4, show_default=True,
              help="Batches for the before/after agreement.")
@click.option("--seed", type=int, default=0, show_default=True)
@target_dtype_option("bf16", "With --target: calibration and the before/after agreement run on its signals.")
@target_quant_options("calibrate and measure the drafter against it (with --target / --data): the GPTQ / AWQ / "
                      "SmoothQuant statistics, static input scales and the before / after agreement then come from "
                      "the compressed target's hidden states, which re-calibrates a drafter for a deployment "
                      "beside that target (no training; distill --init --target-quant re-aligns the weights); "
                      "the step records the spec", data_default="--data (the calibration windows)")
@click.option("--recover-steps", type=click.IntRange(min=0), default=0, show_default=True,
              help="After quantizing, train the quantized drafter this many steps against --target on --data with "
                   "its family's distillation loss, through the scheme's own rounding (straight-through gradients; "
                   "quantization-aware distillation); the artifact stores codes and scales like any other of its "
                   "scheme. Costs about one distill step per step (the fake quantization adds a few elementwise "
                   "passes over the weights). Pays where rounding costs acceptance: int3, int2, ternary, and even int4 "
                   "GPTQ after a shared head (600 steps, --recover-batch 4, --recover-lr 5e-4: 94.4 -> 97.9 % of "
                   "tau; int3 GPTQ: 96.6 % at 8.4x fewer bytes than 16-bit, against 92.8 % with 200 steps at the "
                   "default lr; BENCHMARKS.md).")
@click.option("--recover-lr", type=float, default=1e-4, show_default=True,
              help="Peak learning rate of the recovery (AdamW, warmup then cosine).")
@click.option("--recover-scales", type=click.Choice(["learned", "rederived"]), default="learned", show_default=True,
              help="learned: the quantizer's scales (RTN's, GPTQ's, AWQ's) are trained with the weights (integer and "
                   "low-bit schemes; others re-derive); rederived: the scheme's round-to-nearest re-derives them "
                   "from the trained weights every step (every scheme; GPTQ's / AWQ's choice is lost at once).")
@click.option("--recover-batch", type=click.IntRange(min=1), default=8, show_default=True,
              help="Windows per recovery step (of --seq-len tokens).")
@click.option("--resume", is_flag=True,
              help="Continue a recovery interrupted in <out>.partial/ (the quantization is not redone).")
def quantize(drafter_dir: Path, out: Path, scheme: str, method: str | None, group_size: int | None,
             symmetric: bool | None, activations: str | None, act_calibration: str | None, kv_cache: str | None,
             calib_inputs: str,
             include: str | None, exclude: str | None, target_dir: Path | None,
             data_path: Path | None, budget_text: str | None, candidates: str | None, sensitivity: str | None,
             dequantize_out: bool, dtype: str, legacy_float_dtype: str | None, force: bool,
             calib_batches: int | None,
             batch: int, seq_len: int,
             eval_batches: int, seed: int, target_dtype: str, target_quant: str | None,
             target_quant_data: str | None, recover_steps: int, recover_lr: float, recover_scales: str,
             recover_batch: int, resume: bool) -> None:
    """Quantize a drafter's Linear weights and report bytes and agreement before / after.

    Every Linear of the drafter is quantized except the draft lm_head (unless --include lm_head) and
    what --exclude names; embeddings, norms, biases and d2t/t2d stay unquantized (floats stored in
    --dtype, bf16 for an fp32 source by default); the target's shared
    embeddings / head are never touched. EAGLE-3's and DFlash's fc IS quantized (--exclude fc keeps it).
    --method gptq calibrates on the activations entering each Linear (needs --target and --data).
    With --target/--data the per-position top-1 agreement with the target is measured on held-out
    windows before and after; everything goes into the artifact's provenance.

    Schemes (each --scheme lists the engine whose form it follows): int8 / int4 integer codes by
    round-to-nearest, GPTQ, AWQ (int4, W4A16 with a pre_quant_scale: Model Optimizer / TensorRT-LLM INT4_AWQ;
    activation-aware scales, then llm-awq's weight-range clipping search) or SmoothQuant (int8 W8A8: Model
    Optimizer INT8_SQ); fp8 e4m3 weights with per-token activations by default (vLLM FP8, llm-compressor
    FP8_DYNAMIC), static calibrated ones (Model Optimizer FP8) or none; nvfp4 (W4A16 by default, Model
    Optimizer's drafter default; W4A4 with --activations static); mxfp8 / mxfp4 (OCP MX, activations per block
    at run time by default); nf4 / fp4 (and int8 with --method bnb) through bitsandbytes. Static scales are
    calibrated on real speculative rounds over --target by default (--calib-inputs), with --act-calibration's
    rule (mse by default; fixed:V needs no data). The in-memory drafter is rounded to --dtype too, so
    the measured cost is the stored one. The artifact stores packed codes and scales (each scheme's key layout
    is documented in its file under specpress/models/quantized/) and reloads into quantized modules the
    runtime runs directly; --dequantize writes plain float weights instead (weight-only schemes), to deploy
    elsewhere.

    Speed: per-channel int8 runs on CPU through PyTorch's weight-only int8 kernel (activations rounded to
    bf16 for that product), so it makes drafting faster as well as smaller: with --include lm_head it took
    EAGLE-3's dynamic tree on the medium zoo target from 1.60-1.72x to 1.81-1.94x at unchanged tau
    (BENCHMARKS.md, "Speed on the medium target"). int4 in groups of 32-256 runs through PyTorch's int4
    kernel and nf4 / fp4 through bitsandbytes' fused kernel on AVX512-BF16 CPUs, both on bf16-rounded
    activations: on the small zoo EAGLE-3 drafter int4 g64 drafts as fast as fp32 (0.82x with --include
    lm_head; it was 2.3x / 7.1x slower, dequantizing every forward); int3 / int2 / ternary codes run through the
    same int4 kernel (shifted to its zero point, the same weights). bnb int8 and the layouts those kernels
    refuse (`kernel_note` on the module says why) still dequantize every forward, and fp8, nvfp4, mx and every
    scheme that quantizes activations are emulated on the CPU: they save bytes, not time.

    Budget: --budget SIZE --candidates int8,int4:g64,... picks one scheme per Linear instead: each selected
    Linear is quantized alone with each candidate and scored (--sensitivity), then a greedy allocation
    spends the bytes where the score drops most per byte; the drafter stores at most SIZE, exactly as
    inspect counts it. The kl pass costs (Linears x candidates) teacher-forced passes of the drafter over
    --calib-batches windows (seconds for a zoo EAGLE-3, 9 Linears x 3 candidates); it pays when the sizes you
    need fall between two uniform schemes (measured: it ties or beats uniform round-to-nearest int4 of the same
    bytes, +0.047 tau at int4-g16's, but not int4 GPTQ at g64's; BENCHMARKS.md). More than one scheme makes a "mixed" artifact: it saves, loads,
    decodes and exports to ONNX; export hf refuses it (one quantization_config per checkpoint there).

    \b
    Examples:
      specpress quantize --drafter drafters/eagle3 --out drafters/eagle3-int4 --scheme int4
      specpress quantize --drafter drafters/eagle3 --out drafters/eagle3-gptq --scheme int4 --method gptq \\
          --target ~/.cache/specpress/zoo/small --data zoo:train
      specpress quantize --drafter drafters/eagle3 --out drafters/eagle3-nf4 --scheme nf4 --include lm_head
      specpress quantize --drafter drafters/eagle3 --out drafters/eagle3-fp8 --scheme fp8
      specpress quantize --drafter drafters/eagle3 --out drafters/eagle3-w4a4 --scheme nvfp4 \\
          --activations static --target ~/.cache/specpress/zoo/small --data zoo:train
      specpress quantize --drafter drafters/eagle3 --out drafters/eagle3-sq --scheme int8 --method smoothquant \\
          --target ~/.cache/specpress/zoo/small --data zoo:train
      specpress quantize --drafter drafters/eagle3 --out drafters/eagle3-int4-fp --scheme int4 --dequantize
      specpress quantize --drafter drafters/eagle3 --out drafters/eagle3-1m --budget 1MiB \\
          --candidates int8,int4:g64,int4:g128 --target ~/.cache/specpress/zoo/small --data zoo:train
    """
    from specpress.artifacts import claim_output
    from specpress.compress.guards import check_seq_len
    from specpress.compress.data import check_data
    from specpress.compress.quantize.pipeline import quantize_from_dirs
    from specpress.compress.quantize.report import report_lines
    from specpress.compress.quantize.request import quantize_request

    req = quantize_request(scheme, method, group_size=group_size, symmetric=symmetric, activations=activations,
                           act_calibration=act_calibration, kv_cache=kv_cache, include=include, exclude=exclude,
                           budget=budget_text, candidates=candidates, sensitivity=sensitivity, dtype=dtype,
                           legacy_float_dtype=legacy_float_dtype, recover_steps=recover_steps, recover_lr=recover_lr,
                           recover_scales=recover_scales, recover_batch=recover_batch, seq_len=seq_len, seed=seed,
                           target_quant=target_quant, target_quant_data=target_quant_data, resume=resume)
    recovery = req.recovery
    with claim_output(out, force=force, inputs={"--drafter": drafter_dir, "--target": target_dir,
                                                "--data": data_path}, partial=recovery is not None,
                      resume=resume, writes="drafter") as claim:
        if target_dir is not None:
            check_seq_len(target_dir, seq_len, batch if recovery is None else max(batch, recover_batch),
                          training=recovery is not None)
        if data_path is not None:
            check_data(data_path)  # a device, a FIFO or more text than memory: refused before loading
        try:
            rep = quantize_from_dirs(drafter_dir, req.config, out, target_dir=target_dir, data_path=data_path,
                                     dequantize_out=dequantize_out, force=force, calib_batches=calib_batches,
                                     batch=batch, seq_len=seq_len, seed=seed, eval_batches=eval_batches,
                                     calib_inputs=calib_inputs, progress=True, target_dtype=target_dtype,
                                     **req.run_kwargs())
        except KeyboardInterrupt:
            if claim.partial is None:
                raise
            from specpress.compress.guards import distill_saved, interrupted

            saved = distill_saved(claim.partial)
            saved = f"the recovery at {saved}" if saved else \
                "the quantized drafter" if (claim.partial / "quantized").is_dir() else None
            raise interrupted(claim.partial, saved) from None
    for line in report_lines(rep):
        click.echo(line)
