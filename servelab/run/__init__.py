"""Orchestration: what starts servers and measures stages (the lab, the benchmark, the walkthrough)."""
