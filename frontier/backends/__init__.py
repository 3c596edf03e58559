"""Built-in backends. Each is self-contained: it receives a validated
:class:`frontier.api.DraftRequest` and returns a :class:`frontier.Frontier`."""
