"""The Ray engine: start-up, worker and driver actors, the round loop.

Importing it before Ray prepares this process to join a cluster with Ray's token
authentication (the warm cluster of ``raysim cluster start``, or a `ray start` cluster, which
enables it by default): Ray reads its authentication mode when it is imported, so it is set
when such a cluster may be joined (one runs, RAY_ADDRESS names one, or this machine holds
Ray's token).
"""

import os

from raysim.engine.launch.warm_cluster import RAY_TOKEN, join_environment, running_cluster

if running_cluster() is not None or os.environ.get("RAY_ADDRESS") or RAY_TOKEN.is_file():
    join_environment()
