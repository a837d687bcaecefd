"""Orchestration: what starts servers (families: one adapter per family) and measures stages (the lab, the benchmark, the walkthrough)."""
