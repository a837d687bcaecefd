"""Run the lab's compose stages on this machine, for real, with a private Docker engine.

``engine`` starts a dockerd of our own (its socket, exec root, log and bridge private to one run; its
data root with the layer cache in the per-user cache) and stops it by PID; ``compose_tool`` finds or
fetches Docker Compose v2; ``base_image`` makes the Debian 12 base image once with debootstrap;
``wheelhouse`` downloads the pinned Python packages the images install; ``standins`` builds the
stand-in base images the compose files' build arguments point at where NVIDIA's images cannot be
pulled; ``compose_stages`` brings a stage up and down with the unchanged compose files plus the no-GPU
override; ``servelab.cli.containers`` is ``servelab containers``.
"""
