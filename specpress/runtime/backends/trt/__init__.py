"""What a TensorRT engine needs at run time as much as at build time: the guarded TensorRT import
(`library`), the `specpress::TreeAttention` plugin (`plugin`) and the one function its GPU path
calls (`kernel`). It lives under runtime/ so the tensorrt backend never imports export/; the engine
builder in `specpress.export.trt` imports it from here."""
