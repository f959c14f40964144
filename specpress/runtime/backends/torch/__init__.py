"""`--backend torch`: the drafter's torch module as it is loaded (eager, quantized modules, or compiled with
--compile); `--target-backend torch`: the target's torch module. The runners live in `runner.py`."""

from pathlib import Path

from specpress.runtime.backends import Backend, register


def _bytes(path: Path) -> int:
    from specpress.models.inspect import inspect_artifact

    return int(inspect_artifact(path)["bytes"])  # the drafter's own weights as stored (shared target tensors apart)


BACKEND = register(Backend(
    "torch", f"{__name__}.runner", reads="drafter", size=_bytes, runs_target=True, modules=True,
    install_hint="torch is a core dependency of specpress: reinstall it with `pip install specpress`"))
