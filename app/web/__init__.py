"""Web pages Engram serves itself."""
