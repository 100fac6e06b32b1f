"""Benchmark scripts (issue 6). Run from the repository root: ``python -m bench.<script> --help``.

Results and the commands that produced them are in BENCHMARKS.md. Large data lives outside git, under
``$REGIS_BENCH_DATA`` (default ``/work/perf-data``).
"""
