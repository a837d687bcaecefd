"""The core: the model, its artifacts and variants, pre/postprocessing, settings, paths, processes,
hardware facts, the catalogue of stages, lessons and models, and the third-party binaries' installers."""
