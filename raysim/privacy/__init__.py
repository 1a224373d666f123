"""Client-level differential privacy (``privacy:``): Poisson sampling of clients, clipping
and Gaussian noise of the clients' weight updates, and the privacy budget from Google's
dp-accounting (the server's private mean is an aggregation operator:
:mod:`raysim.privacy.private_mean`)."""
