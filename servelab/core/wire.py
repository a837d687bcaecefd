"""What the model services and their clients agree on, in one place the web front end can import without
the FastAPI stack (its image has none): the version header, and the latency histogram's buckets."""

VERSION_HEADER = "X-Model-Version"  # the model version that answered (servelab.servers.fastapi.runtimes.model_version)

# Milliseconds to tens of seconds: an H100 inference and a CPU service at concurrency 16 both fit.
SECONDS_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
                   0.75, 1.0, 2.0, 5.0, 10.0, 30.0)
