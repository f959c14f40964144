"""`run` and `bench` from directories to reports: load the target (compressed with --target-quant when asked,
so this floor sits above compress/), the drafter through its backend (exporting on demand: above export/), then
decode with runtime/'s loop and measure. The Python API a user scripts against:

    from specpress.decode.bench_pipeline import bench_from_dirs
    from specpress.decode.run_pipeline import run_request, run_decode
"""
