"""Model vectors and their sums, Ray-free: a model's weights as one flat vector on its device
(:mod:`.weights`), a weighted sum of models in float64 (:mod:`.weighted_sum`) computed block
by block (:mod:`.blocked_sum`), and the fixed reduction tree along which partial sums merge so
that 1 or N workers give the same bits (:mod:`.reduction_tree`)."""
