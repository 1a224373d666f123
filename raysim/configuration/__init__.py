"""The experiment configuration: the typed sections every layer reads (:mod:`.schema`), the
whole experiment assembled from them with its YAML, overrides and one clear message per
problem (:mod:`.experiment`), the rendered reference (:mod:`.reference`) and grids of configs
(:mod:`.sweep`). The package imports nothing itself: each module sits at its own layer."""
