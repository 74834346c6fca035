"""Hooks a serving engine loads into its own processes (``plugins.vllm``: vLLM's general
plugin). Importing this package imports nothing else: an engine loads it in every process,
recording or not."""
