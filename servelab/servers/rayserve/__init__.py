"""Ray Serve stages: the same Food-11 service, replicated over the nodes of a Ray cluster (docs/ray.md).
Never name a folder ``ray`` on ``sys.path``: it would shadow the ``ray`` package.
"""
