"""`--backend onnxruntime`: the drafter's exported graphs (an `export onnx` directory) in onnxruntime sessions;
`--target-backend onnxruntime`: the target's forward as one exported graph (an `export target` directory).
The commands export a drafter artifact or a target directory on demand (specpress.export.ondemand). The
runners live in `runner.py`."""

from pathlib import Path

from specpress.runtime.backends import Backend, files_bytes, register


def _bytes(path: Path) -> int:
    if (Path(path) / "manifest.json").is_file():
        from specpress.manifest import load_manifest

        return load_manifest(path).drafter_bytes  # the graphs; the target's shared tensors excluded
    return files_bytes(path)


BACKEND = register(Backend("onnxruntime", f"{__name__}.runner", reads="onnx", size=_bytes, runs_target=True,
                           install_hint="pip install 'specpress[ort]'"))
