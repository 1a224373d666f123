"""The features a run's settings add to it, one module each: client-level DP
(:mod:`.client_dp`, with its layer :mod:`.private_mean`), the server optimizer
(:mod:`.server_optimizer`) and the simulated clock (:mod:`.clock`, with FedBuff's layer
:mod:`.fedbuff`); :mod:`.assembly` wraps a run's algorithm in their layers (never inherited)
and collects what they add to its rounds. An algorithm opts into the mean-based layers by
declaring its :attr:`~raysim.algorithms.base.Algorithm.mean_uploads`."""
