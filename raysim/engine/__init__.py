"""The Ray engine: start-up, worker and driver actors, the round loop.

Importing it before Ray prepares this process to join a warm cluster (``raysim cluster
start``): Ray reads its authentication mode when it is imported.
"""

from raysim.engine.cluster import join_environment, running_cluster

if running_cluster() is not None:
    join_environment()
