"""The ``dg-agents`` command line."""
