"""The serving engines (HF transformers, vLLM, llama.cpp, SGLang, TensorRT-LLM): what each runs the
way it was measured (`capabilities`, a shared leaf the search space and the profile schema name), its
options per release (`flagsets`, checked by `flagcheck`) and the export of a profile to a ready-to-run
deployment (`export`, built from `fragments`, `commands`, `llamacpp_args` and `schedule`).
"""
