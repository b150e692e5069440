"""Launching: which launcher started the process, the settings it passed, its health, elastic restarts."""
