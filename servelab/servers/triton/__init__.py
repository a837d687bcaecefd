"""Triton Inference Server stages: model configs as data, a local server without Docker, request helpers."""
