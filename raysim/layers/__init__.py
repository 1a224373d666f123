"""The features a run's settings add to it, one module each: client-level DP
(:mod:`.client_dp`, with its layer :mod:`.dp_mean`), the server optimizer
(:mod:`.server_optimizer`), the simulated clock (:mod:`.simulated_clock`, with FedBuff's layer
:mod:`.fedbuff`) and update compression (:mod:`.compression`); :mod:`.registry` lists them,
:mod:`.assembly` wraps a run's algorithm in their layers (never inherited), collects what they
add to its rounds and builds its round loop. An algorithm opts into the mean-based layers by
declaring its :attr:`~raysim.algorithms.base.Algorithm.mean_uploads`."""
