"""`--backend tensorrt`: the drafter as TensorRT engines (an `export trt` directory) on a CUDA device, the
target on torch. `runner.py` loads them; what an engine needs at run time as much as at build time lives
here too: the guarded TensorRT import (`library`), the `specpress::TreeAttention` plugin (`plugin`) and the
one function its GPU path calls (`kernel`); the engine builder in `specpress.export.trt` imports them from
here, so the backend never imports export/. Engines are built from an `export onnx --attention plugin`
directory on the GPU they run on, so a drafter artifact is not prepared on demand."""

from specpress.runtime.backends import Backend, register

INSTALL_HINT = ("pip install 'specpress[trt]' (TensorRT from NVIDIA's index: --extra-index-url "
                "https://pypi.nvidia.com) on a CUDA machine; engines built by TensorRT for RTX need "
                "'specpress[trt-rtx]' and an RTX-class GPU")

BACKEND = register(Backend("tensorrt", f"{__name__}.runner", reads="engine", install_hint=INSTALL_HINT))
