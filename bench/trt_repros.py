"""Smallest graphs reproducing the two TensorRT for RTX 1.7.1 failures met by specpress's exports (issue 23).

    python bench/trt_repros.py [--out DIR]

Each case is an ONNX graph built with the onnx helper API and compiled ahead of time (sm89, strongly typed)
in its own subprocess, so an abort of the builder does not end this script; it prints one line per case.
- qdq-*:      y0 = MatMul(x, DQ(int8 W0)); y1..y3 = MatMul(y0, DQ(int8 Wi)) split into heads (an fc feeding
              q / k / v), scales per output channel, written
              as a one-block blocked DequantizeLinear (scale [1, N], axis 0, block_size K: what the export
              wrote before) or per-axis (scale [N], axis 1: what it writes now).
- profile-*:  q = Concat(a [1,1,C,64], b [1,1,B,64]) + p [1,1,CB,64] -> specpress::TreeAttention(q, q, q),
              with the profile's CB sized apart from C + B (what the DFlash profile did before) or as the sum.
Needs tensorrt_rtx (pip install 'specpress[trt-rtx]'); no GPU.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

K = 128


def qdq_graph(path: Path, form: str) -> None:
    import numpy as np
    import onnx
    from onnx import TensorProto as TP, helper as h, numpy_helper as nh

    rng = np.random.default_rng(0)
    nodes, inits = [], []
    for i, (src, n) in enumerate((("x", K), ("y0", 16), ("y0", 8), ("y0", 8))):  # fc, then q / k / v
        inits.append(h.make_tensor(f"w{i}", TP.INT8, [K, n], rng.integers(-127, 128, size=K * n).tolist()))
        scale = (rng.random(n) * 0.01).astype(np.float16)
        if form == "blocked":
            inits.append(nh.from_array(scale.reshape(1, n), f"s{i}"))
            nodes.append(h.make_node("DequantizeLinear", [f"w{i}", f"s{i}"], [f"d{i}"], axis=0, block_size=K))
        else:
            inits.append(nh.from_array(scale, f"s{i}"))
            nodes.append(h.make_node("DequantizeLinear", [f"w{i}", f"s{i}"], [f"d{i}"], axis=1))
        nodes.append(h.make_node("MatMul", [src, f"d{i}"], [f"m{i}" if i else "y0"]))
        if i:  # heads of size 8: [1, t, n] -> [1, n / 8, t, 8]
            inits.append(nh.from_array(np.array([1, -1, n // 8, 8], np.int64), f"shape{i}"))
            nodes.append(h.make_node("Reshape", [f"m{i}", f"shape{i}"], [f"r{i}"]))
            nodes.append(h.make_node("Transpose", [f"r{i}"], [f"y{i}"], perm=[0, 2, 1, 3]))
    g = h.make_graph(nodes, "qdq", [h.make_tensor_value_info("x", TP.FLOAT16, [1, "t", K])],
                     [h.make_tensor_value_info(f"y{i}", TP.FLOAT16, None) for i in (1, 2, 3)], inits)
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 23)]), str(path))


def profile_graph(path: Path) -> None:
    import onnx
    from onnx import TensorProto as TP, helper as h

    f16 = TP.FLOAT16
    nodes = [h.make_node("Concat", ["a", "b"], ["ab"], axis=2), h.make_node("Add", ["ab", "p"], ["q"]),
             h.make_node("TreeAttention", ["q", "q", "q", "committed", "tree_mask"], ["y"], domain="specpress",
                         num_heads=1, num_kv_heads=1, head_size=64, scale=0.125, plugin_version="1",
                         plugin_namespace="specpress")]
    ins = [h.make_tensor_value_info(n, f16, [1, 1, d, 64]) for n, d in (("a", "c"), ("b", "b"), ("p", "cb"))]
    ins += [h.make_tensor_value_info("committed", TP.INT32, [1]),
            h.make_tensor_value_info("tree_mask", TP.INT32, ["cb", "w"])]
    g = h.make_graph(nodes, "profile", ins, [h.make_tensor_value_info("y", f16, [1, 1, "cb", 64])])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 23), h.make_opsetid("specpress", 1)]), str(path))


def build(path: str, case: str) -> None:
    """In the child: parse + build; print the builder's errors and BUILD OK / BUILD FAIL."""
    import tensorrt_rtx as trt

    from specpress.runtime.backends.tensorrt.plugin import register_tree_attention

    register_tree_attention(trt)

    class Logger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity, msg):  # noqa: ANN001
            if severity <= trt.ILogger.ERROR:
                print(f"  [{str(severity).split('.')[-1]}] {msg[:240]}", flush=True)

    logger = Logger()
    builder = trt.Builder(logger)
    net = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(net, logger)
    if not parser.parse_from_file(path):
        print("PARSE FAIL", flush=True)
        return
    config = builder.create_builder_config()
    prof = builder.create_optimization_profile()
    if case.startswith("qdq"):
        prof.set_shape("x", (1, 1, K), (1, 16, K), (1, 32, K))
    else:
        cb = (2, 32, 64) if case == "profile-sum" else (1, 16, 32)
        for n in "ab":
            prof.set_shape(n, (1, 1, 1, 64), (1, 1, 16, 64), (1, 1, 32, 64))
        prof.set_shape("p", *[(1, 1, x, 64) for x in cb])
        prof.set_shape("tree_mask", *[(x, 2) for x in cb])
        prof.set_shape("committed", (1,), (1,), (1,))
    config.add_optimization_profile(prof)
    config.num_compute_capabilities = 1
    config.set_compute_capability(trt.ComputeCapability.SM89, 0)
    engine = builder.build_serialized_network(net, config)
    print("BUILD OK" if engine is not None else "BUILD FAIL", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="keep the graphs here (default: a temporary folder)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        build(*args.child)
        return
    try:
        import tensorrt_rtx  # noqa: F401
    except ImportError as exc:
        raise SystemExit(f"these repros need TensorRT for RTX ({exc}); pip install 'specpress[trt-rtx]'") from exc
    out = args.out or Path(tempfile.mkdtemp(prefix="trt-repros-"))
    out.mkdir(parents=True, exist_ok=True)
    cases = {"qdq-blocked": lambda p: qdq_graph(p, "blocked"), "qdq-per-axis": lambda p: qdq_graph(p, "axis"),
             "profile-apart": profile_graph, "profile-sum": profile_graph}
    for case, make in cases.items():
        path = out / f"{case}.onnx"
        make(path)
        run = subprocess.run([sys.executable, __file__, "--child", str(path), case], capture_output=True, text=True)
        out_lines, err_lines = run.stdout.strip().splitlines(), run.stderr.strip().splitlines()
        died = run.returncode != 0 or not out_lines
        print(f"{case:14s} {f'process died (exit {run.returncode})' if died else out_lines[-1]}")
        for line in (out_lines + err_lines[-2:]) if died else out_lines[:-1]:
            print(f"    {line}")


if __name__ == "__main__":
    main()
