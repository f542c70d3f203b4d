"""Idempotency keys: a retry after a lost answer gets the first answer instead of a second write."""
