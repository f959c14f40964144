"""TensorRT engines from `export onnx` directories, with the `specpress::TreeAttention` plugin.

Modules: `kernel` (the node's math, torch), `plugin` (the IPluginV3 and its creator), `probe` (a one-node
check graph), `profiles` (optimization profiles from the dynamic axes), `library` (guarded TensorRT imports),
`builder` (parse, build, write engines + manifest). Importing this package imports no TensorRT and no torch.
"""
