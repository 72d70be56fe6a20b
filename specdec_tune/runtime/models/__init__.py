"""Models: loading them offline (`loading`), what a loaded model is (`loaded`), random-weight shapes (`shapes`),
GGUF files (`ggufs`) and the device they run on (`devices`).
"""
