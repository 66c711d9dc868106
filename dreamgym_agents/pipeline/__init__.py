"""The learning pipeline: embedded defaults and bundles, the staged run, the benchmark and its
report.
"""
