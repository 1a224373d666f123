"""Ray and its processes, up and down: a local Ray started alongside imports and data, the
warm cluster (``raysim cluster start``), CPU slots shared between invocations, the watchdog that
stops orphaned processes, the bytecode cache, and every use of Ray's private modules
(:mod:`.ray_internals`). Nothing here knows about runs or rounds."""
