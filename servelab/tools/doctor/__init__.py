"""``servelab doctor``: is this machine ready for the lab? One line per check, with the fix.

``runner`` holds what every check shares; ``gpu``, ``container_checks``, ``image_checks`` and ``local`` the
checks; ``checks`` their table. The ``servelab doctor [--node] [--json]`` command is ``servelab.cli.doctor``.
"""
