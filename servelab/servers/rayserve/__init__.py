"""Ray Serve stages: the same Food-11 service, replicated over the nodes of a Ray cluster.

``options`` (the stages as deployment options), ``cluster`` (a local head and worker nodes as child processes),
``deployment`` (the Serve deployment serving ``fastapi_onnx/app.py``'s app, ``@serve.batch``, deploy,
replica placement), ``control`` (deploy, status, the cluster ``servelab ray up`` leaves running; its
front is ``servelab.cli.ray``). Never name a folder
``ray`` on ``sys.path``: it would shadow the ``ray`` package.
"""
