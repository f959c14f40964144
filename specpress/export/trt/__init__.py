"""TensorRT engines from `export onnx` directories, with the `specpress::TreeAttention` plugin.

Modules: `probe` (a one-node check graph), `profiles` (optimization profiles from the dynamic axes),
`builder` (parse, build, write engines + manifest), `pipeline` (the CLI's path: engines_from_onnx). The
plugin, its kernel and the guarded TensorRT imports live in `specpress.runtime.backends.tensorrt`: engines need them at run time too. Importing this
package imports no TensorRT and no torch.
"""
