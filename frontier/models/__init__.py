"""Real models for tests and tools, built locally from pip-installable packages (no hub downloads).

Nothing here is imported by ``import frontier``; each module imports its heavy dependencies
(transformers, gguf) only when called.
"""
