"""KV caches and the engine modes that choose them: transformers' growing cache (`dynamic`), the
per-row cache of the batched eager loop (`rowcache`), the preallocated static one (`slots`), the
execution context (`modes`) and `--engine auto` (`auto`).
"""
