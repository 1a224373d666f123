"""The Ray engine: worker pool, driver actor, runner. Knows no specific algorithm."""
