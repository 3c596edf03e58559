"""Subcommands of the ``frontier`` CLI (see :mod:`frontier.cli`)."""
