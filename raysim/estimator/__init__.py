"""``raysim estimate``: a config's cost probed here (:mod:`.estimate`), a probe's seconds
extended along one config key (:mod:`.extrapolation`) and projected to a cluster's nodes and
links (:mod:`.cluster_projection`)."""
