"""The package version, in a module of its own: the session and the broker read it without
importing the package root (which imports the client, which imports the session)."""
__version__ = "0.1.0"
