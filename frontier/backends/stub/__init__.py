from .backend import StubBackend

__all__ = ["StubBackend"]
