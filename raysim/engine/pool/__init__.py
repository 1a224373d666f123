"""Actors shared by the runs of one invocation: idle workers and drivers passed from run to run
(:mod:`.shared_actors`), worker hosts that serve several seeds at once (:mod:`.worker_host`,
:mod:`.seed_groups`), and the keeper that holds idle actors on a warm cluster between
invocations (:mod:`.keeper`)."""
