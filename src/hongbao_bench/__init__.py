"""Benchmarks: the designs described by the seed articles, measured by one harness.

`harness.run_scenario` drives any object with async ``setup / grab / verify / teardown``
(see `harness.Design`) and checks the money from the design's own storage;
`harness.run_seed_baseline` replays seed 002's Java TestEval (20 threads, one Lua EVAL
per grab). The competing designs of seed 003 and seed 000 live in `designs`.
"""
