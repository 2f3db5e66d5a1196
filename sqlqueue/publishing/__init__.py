"""Publishing: validate messages, then write them in the caller's transaction."""
