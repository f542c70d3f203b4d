"""What memory search and history search share: SQL parameters and the fusion that ranks."""
