"""``servelab doctor``: is this machine ready for the lab? One line per check, with the fix."""
