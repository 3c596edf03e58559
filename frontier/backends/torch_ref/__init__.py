from .backend import TorchRefBackend

__all__ = ["TorchRefBackend"]
