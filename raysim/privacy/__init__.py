"""Client-level differential privacy (``privacy:``): Poisson sampling of clients, clipping
and Gaussian noise of the clients' weight updates, the server's private mean, and the privacy
budget from Google's dp-accounting."""
