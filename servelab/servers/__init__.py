"""The servers: FastAPI and Triton, and those built on them (Ray Serve, GourmetGram)."""
