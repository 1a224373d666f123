"""Sites that differ in speed, bandwidth and availability (``system:``): profiles, the simulated
clock and its policies (sync, deadline, over-selection, FedBuff)."""
