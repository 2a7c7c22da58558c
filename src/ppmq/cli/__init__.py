"""The `ppmq` command (PROTOCOL §7) and its man pages: the top layer, which may use every other."""
