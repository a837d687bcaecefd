"""Run the lab's compose stages on this machine, for real, with a private Docker engine and stand-in base
images where NVIDIA's cannot be pulled (``servelab containers``)."""
