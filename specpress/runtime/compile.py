"""`--compile` / `--compile-target`: TorchInductor compilation of the drafter's / the target's forward.

On a CPU a drafter forward over one to a few new tokens spends about half its time outside the matrix
multiplies (norms, rotary, masks, module calls); Inductor fuses that work. `--compile` compiles only
the drafter: the target stays eager, so a bench's plain baseline and its verify forwards run the same
code and the speedup moves only because drafting got cheaper. `--compile-target` compiles the target
too, and then the plain baseline runs the same compiled target: the speedup of a compiled speculative
decoder over a compiled plain one. Shapes change every round (cache length, tree width, number of
accepted tokens), hence dynamic shapes; the first calls compile (tens of seconds on CPU).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from specpress.errors import RequestError


def compile_drafter(drafter) -> None:  # drafter: any registered Drafter (an nn.Module)
    """Compile `drafter`'s forward in place; its weights, caches and outputs are unchanged."""
    drafter.compile(dynamic=True)


def compile_target(target) -> None:  # target: TargetModel
    """Compile the target's forward in place with automatic dynamic shapes (dynamic=True would make the
    `taps` ints symbolic and lose the taps)."""
    target.compile()


@contextmanager
def compile_errors(enabled: bool, what: str = "the drafter", flag: str = "--compile") -> Iterator[None]:
    """Turn a failure inside torch.compile (compiling `what`) into a RequestError that says how to run without it."""
    if not enabled:
        yield
        return
    from torch._dynamo.exc import TorchDynamoException  # Inductor's errors derive from it
    from torch._inductor.exc import CppCompileError

    try:
        yield
    except (TorchDynamoException, CppCompileError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RequestError(f"{flag} failed while compiling {what} ({type(exc).__name__}: {first}); "
                           f"Inductor needs a working C++ compiler on CPU. Run without {flag}.") from exc
