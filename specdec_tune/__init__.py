"""specdec-tune: a hardware-aware autotuner for speculative decoding.

The package reads as its pipeline: `runtime` (models, cache, drafters, engine, workloads) ->
`measure` (timer, bench, costs profiler, hardware, HF yardstick) -> `search` (cost model, space,
study, tuner, final round) -> `store` (profile schema, YAML, atomic writes) -> `output` (check,
export, tables, plots); `app` holds the use cases (the Python API) and `cli` parses and renders.
`domain` (the shared dataclasses) and `limits` (the allowed ranges) sit under all of them.
"""

__version__ = "0.2.0"
