"""Layers that wrap an algorithm to change how the mean of its uploads is taken, composed for a
run by :func:`~raysim.layers.compose.compose` (never inherited): client-level DP
(:mod:`.private_mean`) and FedBuff's asynchronous buffered rounds (:mod:`.fedbuff`). An
algorithm opts in by declaring its :attr:`~raysim.algorithms.base.Algorithm.mean_uploads`."""
