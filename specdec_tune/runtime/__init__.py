"""Running the models: `models/` (loading, shapes, GGUFs, devices), `caches/` (KV caches, engine
modes, `--engine auto`), `drafting/` (drafters, hybrid, gamma policies, the factory), the decode
loops (`decode` at batch 1, `batch` for B rows), `session` (what a command loads) and `workloads`.
"""
