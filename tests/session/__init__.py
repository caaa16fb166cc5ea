"""The sans-IO session (pulsarwire/session.py): its transition table, its byte contract."""
