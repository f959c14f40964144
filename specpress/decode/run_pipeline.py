"""The CLI's path for `specpress run`: one prompt in, its continuation and the tau / speed line out.

    req = run_request("zoo/small", "def parse_args(", 48, drafter_dir="drafters/eagle3")
    res = run_decode(req)
    print(res.output)  # the prompt and its continuation (run's stdout)
    print(stats_line(res))  # run's stderr line: tokens, tok/s, policy, tau

`run_request` checks the option combinations (the same UsageError / RequestError messages, in the same order, as
the CLI) before anything loads; `run_decode` encodes the prompt, checks it fits the machine before the target's
weights load, loads (and with --target-quant compresses) the target, loads the drafter on its backend and decodes
plainly or speculatively; with a compressed target at temperature 0 it also decodes the float target's greedy
continuation, to say how many leading tokens the two share.

Importing this module does not import torch (`specpress run --help` must not).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specpress.decode.bench_pipeline import (
    DecodeOptions,
    check_compile,
    check_drafter_dir,
    load_drafter_runner,
    loop_target,
)


@dataclass(frozen=True, kw_only=True)
class RunRequest(DecodeOptions):
    """One prompt to decode, checked (run_request): what run_decode takes. Defaults are the CLI's."""

    target_dir: Path
    prompt: str
    max_new_tokens: int = 64


@dataclass
class RunResult:
    prompt: str
    text: str  # the continuation, decoded by the target's tokenizer
    tokens: list[int]  # the generated ids
    ms: float  # decoding time (plain: prefill + steps; speculative: the loop's wall time)
    policy: Any = None  # the runtime.policy object; None for plain decoding
    rounds: int = 0  # speculative rounds (target verify forwards)
    tau: float | None = None  # tokens per round, bonus included; None for plain decoding
    drift: str = ""  # with a compressed target at temperature 0: target_quant_steps.greedy_drift's clause

    @property
    def output(self) -> str:
        """What `run` prints on stdout: the prompt and its continuation."""
        return self.prompt + self.text


def run_request(target_dir: str | Path, prompt: str, max_new_tokens: int = 64, *,
                drafter_dir: str | Path | None = None, policy: str | None = None, temperature: float = 0.0,
                top_k: int = 0, top_p: float = 1.0, seed: int = 0, dtype: str = "fp32", backend: str = "torch",
                target_backend: str = "torch", target_quant: str | None = None,
                target_quant_data: str | None = None, compile_drafter: bool = False,
                strict: bool = False) -> RunRequest:
    """Check one combination of run's options, before anything loads (the CLI's keywords and refusals).

    target_quant: the --target-quant spec text (parsed here). Raises UsageError / RequestError naming the
    options to change.
    """
    from specpress.compress.quantize.target import parse_spec
    from specpress.decode.target_quant_steps import check_target_backend

    drafter_dir = None if drafter_dir is None else Path(drafter_dir)
    check_compile(compile_drafter, drafter_dir, backend)
    check_drafter_dir(backend, drafter_dir)
    tq = parse_spec(target_quant, target_quant_data)
    check_target_backend(tq, target_backend, False)
    return RunRequest(target_dir=Path(target_dir), prompt=prompt, max_new_tokens=max_new_tokens, drafter_dir=drafter_dir,
                      policy=policy, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, dtype=dtype,
                      backend=backend, target_backend=target_backend, target_quant=tq,
                      target_quant_data=target_quant_data, compile_drafter=compile_drafter, strict=strict)


def run_decode(req: RunRequest, *, echo: Callable[[str], None] | None = None) -> RunResult:
    """Load, decode the prompt once (plainly, or speculatively with req.drafter_dir), return what came out.
    echo: where loading messages go (the compressed target's summary, an on-demand export's progress, a
    drafter built for another target); stderr by default."""
    import torch

    from specpress.limits import prompt_line_limit
    from specpress.models.target import load_target
    from specpress.models.tokenizer import load_tokenizer
    from specpress.runtime.bench import default_policy
    from specpress.runtime.compile import compile_errors
    from specpress.runtime.loop import speculative_generate
    from specpress.runtime.plain import check_decode, decode_plain
    from specpress.runtime.policy import parse_policy
    from specpress.runtime.prompts import encode, max_context
    from specpress.runtime.sampling import SamplingParams
    from specpress.decode.target_quant_steps import compress_target, greedy_drift

    echo = echo if echo is not None else (lambda m: print(m, file=sys.stderr))
    r, tq = req, req.target_quant
    tok = load_tokenizer(r.target_dir)
    ids = encode(r.prompt, tok, prompt_line_limit(max_context(r.target_dir)))
    check_decode(r.target_dir, len(ids), r.max_new_tokens, r.dtype, "--prompt")  # before the target's weights load
    target = float_target = load_target(r.target_dir, dtype=r.dtype)
    if tq is not None:
        target, _ = compress_target(float_target, r.target_dir, tq, r.target_quant_data, r.seed, echo)
    gen = torch.Generator().manual_seed(r.seed)
    params = SamplingParams(r.temperature, r.top_k, r.top_p)
    verifier = loop_target(r.target_backend, target, r.target_dir, r.dtype, False, echo)
    if r.drafter_dir is None:
        g = decode_plain(verifier, ids, r.max_new_tokens, params, gen)
        res = RunResult(r.prompt, tok.decode(g.tokens), g.tokens, g.decode_ms)
    else:
        drafter = load_drafter_runner(r.backend, r.drafter_dir, target, strict=r.strict, warn=echo,
                                      compile_drafter=r.compile_drafter, target_dir=r.target_dir)
        pol = parse_policy(r.policy or default_policy(drafter.family))
        with compile_errors(r.compile_drafter):
            s = speculative_generate(verifier, drafter, ids, r.max_new_tokens, pol, params, gen)
        tau = 1 + sum(x.accepted for x in s.rounds) / max(1, len(s.rounds))
        res = RunResult(r.prompt, tok.decode(s.tokens), s.tokens, s.total_ms, pol, len(s.rounds), tau)
    if tq is not None and params.greedy:
        res.drift = greedy_drift(float_target, ids, r.max_new_tokens, res.tokens)
    return res


def stats_line(res: RunResult) -> str:
    """run's stderr line: tokens, tok/s, the policy and tau (or plain decoding), the compressed target's drift."""
    speed = f"{len(res.tokens)} tokens, {len(res.tokens) / (res.ms / 1e3):.1f} tok/s"
    if res.policy is None:
        return f"[{speed}, plain decoding{res.drift}]"
    return (f"[{speed}, {res.policy}, tau {res.tau:.2f} over {res.rounds} rounds{res.drift}; `specpress bench` "
            f"measures speedup against plain decoding]")
