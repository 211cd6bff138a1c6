"""Examples of the client package in use; each runs as a script."""
