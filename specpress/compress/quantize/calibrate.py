"""Calibration inputs: run the drafter the way the runtime does, on the target's hidden states.

`DrafterCalibration(target, drafter, sampler, batches)` runs the target once per window batch (taps =
drafter.taps, no logits) and keeps its hidden states; calling it with a model runs that model's
teacher-forced forward (models/forced.py) on every batch under no_grad, so forward hooks see the activations entering each Linear:

    eagle / eagle3   drafter(features[:, :-1], ids[:, 1:])  (eagle: final normed hidden; eagle3: fused taps)
    mtp              the chained pass (training-time test): step k reads the previous step's output, one step
                     per MTP module, from the first T - modules positions
    dflash           blocks [anchor, MASK…] at anchors spaced every block_size tokens, context = fused taps
    lm               drafter(ids)

It is the `forward_loop` the calibrated methods take (ModelOpt's convention).

`RoundsCalibration(target, drafter, sampler, batches, policy)` is the other forward loop: real speculative
rounds (runtime/loop.py, greedy) over prompts cut from the same windows, the model given drafting and the
target verifying, so the hooks see every input the drafter meets when it is deployed — every tree level or
chained step, and the hidden states it feeds back to itself — not only the teacher-forced first step.
`calibration_loop(inputs, …)` builds either from the CLI's --calib-inputs words:

    rounds[:POLICY]   real rounds with POLICY (default: the family's default policy)   [the default]
    first-step        the teacher-forced pass above (one step per draft module)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from specpress.compress.data import WindowSampler
from specpress.errors import ConfigError
from specpress.models.drafter import Drafter, get_family
from specpress.models.forced import input_features
from specpress.models.target import TargetModel


@dataclass(frozen=True)
class _Batch:
    ids: Tensor  # [B, T]
    hidden: Tensor  # [B, T, H] final normed hidden
    taps: dict[int, Tensor]


CALIB_BATCHES = 8  # calibration batches a method gets at least (GPTQ more for wide Linears: default_calib_batches)
ROWS_PER_INPUT = 2  # GPTQ's rows per input channel below which its codes can overfit (gptq.py's note)


def default_calib_batches(drafter: Any, config: Any, batch: int, seq_len: int) -> int:
    """The default calibration batches of `config` on `drafter`: CALIB_BATCHES, or for GPTQ enough windows
    that the widest Linear it quantizes sees ROWS_PER_INPUT x its inputs in rows (each calibration window
    gives about seq_len rows), 10 % to spare: GPTQ's Hessian of a K-input Linear is estimated from XᵀX, and
    fewer rows than that fit the codes to the calibration windows. At Llama-3.2-1B's EAGLE-3 drafter (FFN
    8,192 wide) that is 36 batches of 4 x 128 instead of 8; at Llama-3.1-8B's (14,336) 62."""
    from specpress.compress.quantize.api import select_modules
    from specpress.models.quantized.configs import GPTQSettings

    if not isinstance(config, GPTQSettings):  # integer GPTQ and low-bit GPTQ alike
        return CALIB_BATCHES
    names, _ = select_modules(drafter, config)
    widest = max((drafter.get_submodule(n).in_features for n in names), default=0)
    return max(CALIB_BATCHES, math.ceil(1.1 * ROWS_PER_INPUT * widest / (batch * seq_len)))


class DrafterCalibration:
    """A forward loop over `batches` windows of `sampler` (target signals computed once, kept in memory:
    (1 + taps)·B·T·H floats per batch). `progress`: methods that run the loop many times (GPTQ, once per
    group of Linears) show a bar over those passes."""

    def __init__(self, target: TargetModel, drafter: Drafter, sampler: WindowSampler, batches: int = 8,
                 first_step: int = 0, progress: bool = False) -> None:
        self.family, self.progress = drafter.family, progress
        self.taps = tuple(drafter.taps)
        self.windows = batches * sampler.batch
        self.tokens = self.windows * sampler.seq_len
        dev = target.lm_head.weight.device
        self.batches: list[_Batch] = []
        with torch.no_grad():
            for i in range(batches):
                ids = sampler.batch_at(first_step + i).to(dev)
                out = target(ids, taps=self.taps, logits="none")
                self.batches.append(_Batch(ids, out.hidden, dict(out.taps)))

    @torch.no_grad()
    def __call__(self, model: nn.Module) -> None:
        for b in self.batches:
            drafter_forward(model, b.ids, b.hidden, b.taps)  # type: ignore[arg-type]


def drafter_forward(d: Drafter, ids: Tensor, hidden: Tensor, taps: dict[int, Tensor]) -> None:
    """One calibration forward of drafter `d` on windows ids [B, T] with the target's hidden / taps: its
    family's teacher-forced forward (models/forced.py) over every position that has an input token (chained
    drafters: one step per draft module, from the first T - modules positions)."""
    steps = d.draft_modules()
    get_family(d.family).teacher_forced(d, ids, input_features(d, hidden, taps), steps=steps, span=ids.shape[1] - steps)


class RoundsCalibration:
    """A forward loop of real speculative rounds: each window of `batches` sampler batches is split in half,
    the first half is the prompt and the loop generates the second half's length of new tokens (greedy,
    target-verified) with the model given as the drafter, under `policy`."""

    def __init__(self, target: TargetModel, drafter: Drafter, sampler: WindowSampler, batches: int = 8,
                 policy: str | None = None, first_step: int = 0, progress: bool = False) -> None:
        from specpress.runtime.policy import parse_policy

        self.target, self.progress = target, progress
        self.policy_text = policy or get_family(drafter.family).default_policy
        self.policy = parse_policy(self.policy_text)
        half = max(1, sampler.seq_len // 2)
        self.prompts = [row[:half].tolist() for i in range(batches) for row in sampler.batch_at(first_step + i)]
        self.new_tokens = sampler.seq_len - half
        self.windows = len(self.prompts)
        self.tokens = self.windows * sampler.seq_len

    @torch.no_grad()
    def __call__(self, model: nn.Module) -> None:
        from specpress.runtime.backends.torch.runner import TorchTarget, drafter_runner
        from specpress.runtime.loop import speculative_generate

        target, drafter = TorchTarget(self.target), drafter_runner(model)
        for p in self.prompts:
            speculative_generate(target, drafter, p, self.new_tokens, self.policy, eos_ids=())


def calibration_loop(inputs: str, target: TargetModel, drafter: Drafter, sampler: WindowSampler,
                     batches: int, progress: bool = False) -> "DrafterCalibration | RoundsCalibration":
    """The forward loop --calib-inputs names: `rounds[:POLICY]` or `first-step`."""
    kind, _, policy = inputs.partition(":")
    if kind == "rounds":
        return RoundsCalibration(target, drafter, sampler, batches, policy or None, progress=progress)
    if kind == "first-step" and not policy:
        return DrafterCalibration(target, drafter, sampler, batches, progress=progress)
    raise ConfigError(f"--calib-inputs {inputs!r}: choose rounds, rounds:POLICY (e.g. rounds:chain:4) or first-step")
