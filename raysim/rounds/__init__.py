"""One run's rounds, without Ray: the round loop, its callbacks and samplers, checkpoints and
where clients live. Above the algorithms and the training runtime, below the feature layers
(which hand the loop their samplers and callbacks) and the engine (which runs it on Ray
actors)."""
